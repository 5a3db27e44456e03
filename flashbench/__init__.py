"""flashbench: benchmark attention kernels on NVIDIA GPUs and explain them against a roofline model.

Library use, without the CLI:
    import flashbench
    frame = flashbench.load("results/RUN")      # a run as a pandas DataFrame
    result = flashbench.sweep(preset="quick")   # run a sweep (workers own CUDA; this process never does)
"""

from __future__ import annotations

__version__ = "0.1.0"

from flashbench.cases import Case
from flashbench.errors import FlashbenchError
from flashbench.results import load


def sweep(**kwargs):  # noqa: ANN003, ANN201  (the signature and docs live in flashbench.api.sweep)
    """Run a sweep: see flashbench.api.sweep. Imported lazily so `import flashbench` stays light."""
    from flashbench.api import sweep as _sweep

    return _sweep(**kwargs)


__all__ = ["Case", "FlashbenchError", "load", "sweep", "__version__"]
