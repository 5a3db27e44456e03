"""Keep the GPU busy while the host enqueues a sample: NVBench's blocking kernel, in Triton.

Without it a short case's samples are enqueued back to back with nothing keeping the GPU busy while Python
launches the next call; when the GPU catches up with the host, the launch gaps between a call's kernels fall
inside the timing events (bundled forward at N = 1024 on an H100: p20-p80 spread 24%, min 0.259 vs median
0.322 ms). With it, each sample is

    hold()     a one-thread spin kernel on the stream waits until a flag in pinned host memory reaches n
    ...        setup, L2 flush, start event, call(), end event: enqueued behind the spin, not yet running
    release()  the host writes n to the flag: the GPU runs the whole sample from a full queue

Pinned memory from cudaHostAlloc (torch's pin_memory) is mapped into the device's address space wherever CUDA
has unified addressing (every 64-bit Linux system), so the kernel reads the flag through the same pointer
(Triton resolves it with cuPointerGetAttribute). A spin that sees no release within MAX_SPIN reads of the flag
gives up, so a call that waits for the GPU while being enqueued (a synchronize inside it) cannot deadlock the
process; missed() counts such spins and the timing then says that host time was included.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import triton
import triton.language as tl

# Reads of the flag before a spin gives up: each crosses PCIe (about 1 us), so 2**20 is of the order of a
# second, far beyond a sample's host time (tens to hundreds of microseconds).
MAX_SPIN = 1 << 20


@triton.jit
def _empty(unused_ptr):
    # One program that does nothing: calibrate's empty-kernel time, the floor of any timed call.
    pass


def launch_empty(unused: torch.Tensor) -> None:
    """Launch the empty kernel once on the current stream (`unused`: any CUDA tensor; the kernel reads nothing)."""
    _empty[(1,)](unused)


@triton.jit(do_not_specialize=["target"])
def _spin(flag_ptr, missed_ptr, target, max_reads):
    # flag_ptr: int32 in pinned host memory, written by the host; missed_ptr: int32 on the device
    seen = tl.load(flag_ptr, volatile=True)
    reads = 0
    while (seen < target) & (reads < max_reads):
        seen = tl.load(flag_ptr, volatile=True)
        reads += 1
    tl.atomic_add(missed_ptr, (seen < target).to(tl.int32))


def spin(flag: Any, missed: Any, target: int, max_reads: int = MAX_SPIN) -> None:
    """Launch the spin kernel: wait until flag[0] >= target or max_reads reads; count a give-up in missed."""
    _spin[(1,)](flag, missed, target, max_reads, num_warps=1)


class LaunchBlocker:
    """hold() / release() around each sample's launches (module docstring); one per worker process."""

    def __init__(self, device: str = "cuda", max_reads: int = MAX_SPIN) -> None:
        # the CPU build (tests, under Triton's interpreter) has no pinned memory: a plain tensor does
        self.flag = torch.zeros(1, dtype=torch.int32, pin_memory=device == "cuda")
        self._host = self.flag.numpy()  # a view: writing it is a plain store to the pinned page
        self._missed = torch.zeros(1, dtype=torch.int32, device=device)
        self.max_reads = max_reads
        self.count = 0

    def hold(self) -> None:
        self.count += 1
        spin(self.flag, self._missed, self.count, self.max_reads)

    def release(self) -> None:
        self._host[0] = self.count

    def reset(self) -> None:
        self._missed.zero_()

    def missed(self) -> int:
        """Spins that gave up since reset() (synchronizes)."""
        return int(self._missed.item())


def make_blocker() -> tuple[LaunchBlocker | None, str]:
    """A LaunchBlocker proven to hold this GPU's stream, or (None, why not)."""
    try:
        blocker = LaunchBlocker("cuda")
        blocker.hold()  # compiles the spin kernel
        after = torch.cuda.Event()
        after.record()
        time.sleep(0.005)
        held = not after.query()  # not yet released: the event behind the spin must still be pending
        blocker.release()
        after.synchronize()
        if not held:
            return None, "launch blocking off: the spin kernel did not hold the stream"
        if blocker.missed():
            return None, "launch blocking off: the spin kernel did not see the host's release"
    except Exception as exc:
        return None, f"launch blocking off: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return blocker, ""
