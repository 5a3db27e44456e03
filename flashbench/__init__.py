"""flashbench: benchmark attention kernels on NVIDIA GPUs and explain them against a roofline model.

Library use, without the CLI:
    import flashbench
    frame = flashbench.load("results/RUN")      # a run as a pandas DataFrame
"""

from __future__ import annotations

__version__ = "0.1.0"

from flashbench.cases import Case
from flashbench.errors import FlashbenchError
from flashbench.results import load

__all__ = ["Case", "FlashbenchError", "load", "__version__"]
