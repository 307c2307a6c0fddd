"""What this machine and its processes hold in memory (Linux's /proc): the memory free for
a new allocation, which a workload that would not fit is refused against before it
swaps, and a process's resident set now and at its peak, which the experiments' progress
and the benches report; and numpy's huge-page advice, which the emulator turns off."""

from __future__ import annotations

import os
from pathlib import Path


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where the kernel cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss(pid: int | None = None) -> int | None:
    """Resident set size of process ``pid`` (default: this one) in bytes, or None where
    ``/proc`` cannot tell (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss(pid: int | None = None) -> int | None:
    """The most process ``pid`` (default: this one) has held resident since it started or
    since :func:`reset_peak`, in bytes (Linux's VmHWM), or None where ``/proc`` cannot
    tell."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak() -> None:
    """Start this process's peak (VmHWM) over from its resident set now (Linux's
    clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def no_huge_page_stalls() -> None:
    """Stop numpy asking the kernel to back its large arrays with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``), unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise.

    Where the kernel's THP defrag is ``madvise`` (a common default) each such fault may
    compact memory first: on the 2-core reference machine a fresh 1.5 GB array took
    17.6–18.1 s with the advice and 0.59–0.68 s without it, and generating a 2-user S1
    stream 3.3–12.0 s against 1.3 s; the replay's rates did not move (Measured;
    docs/simulator.md, "Huge pages and first-touched memory")."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:  # (the user's choice stands)
        return
    import numpy as np

    advise = getattr(np._core.multiarray, "_set_madvise_hugepage", None)
    if advise is not None:  # (private in numpy 2; absent: nothing to turn off)
        advise(False)
