"""The memory this machine has free for a new allocation (Linux's MemAvailable): what a
workload that would not fit is refused against, before it swaps."""

from __future__ import annotations

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
