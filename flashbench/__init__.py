"""flashbench: benchmark attention kernels on NVIDIA GPUs and explain them against a roofline model.

Library use, without the CLI:
    import flashbench
    frame = flashbench.load("results/RUN")      # a run as a pandas DataFrame
    result = flashbench.sweep(preset="quick")   # run a sweep (workers own CUDA; this process never does)
"""

from __future__ import annotations

__version__ = "0.1.0"

from flashbench.api import SweepResult, sweep
from flashbench.errors import FlashbenchError
from flashbench.results.rows import load
from flashbench.spec.cases import Case

__all__ = ["Case", "FlashbenchError", "SweepResult", "load", "sweep", "__version__"]
