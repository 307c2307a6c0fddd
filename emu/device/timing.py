"""Tier timing: latency + size / bandwidth + queueing, per request, with percentiles.

Each tier is one server: a request of ``n`` bytes arriving at ``t`` starts when the
tier has finished the transfers queued before it, occupies the tier for
``n / bandwidth`` and completes ``latency`` after its transfer ends::

    start      = max(t, busy_until)
    busy_until = start + n / bandwidth
    done       = busy_until + latency

so the fixed latency overlaps between requests (pipelined media) while transfers
serialise — the queueing term.  Migrations occupy the tiers like requests do.

The latency and bandwidth of each tier are the simulator's, defined once in
:mod:`kvcxl.emu.timing` (CXL DRAM 200 ns + 64 GB/s, NVMe 25 µs + 14 GB/s); this
module adds only the queue.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from ..timing import TierParams


@dataclass
class TierQueue:
    """One tier's server state and counters."""

    timing: TierParams
    busy_until: float = 0.0
    requests: int = 0
    bytes: int = 0
    busy_ns: float = 0.0
    latencies: array = field(default_factory=lambda: array("d"))

    def serve(self, t: float, n: int, record: bool = True) -> float:
        """Completion time of ``n`` bytes arriving at ``t``."""
        start = t if t > self.busy_until else self.busy_until
        xfer = n / self.timing.bandwidth_gbps
        self.busy_until = start + xfer
        done = self.busy_until + self.timing.latency_ns
        self.requests += 1
        self.bytes += n
        self.busy_ns += xfer
        if record:
            self.latencies.append(done - t)
        return done

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "bytes": self.bytes,
            "busy_ns": round(self.busy_ns, 1),
            **percentiles(self.latencies),
        }


def percentiles(values: array) -> dict:
    """p50/p95/p99 and mean of latencies in ns (empty → zeros)."""
    if not len(values):
        return {
            "latency_p50_ns": 0.0,
            "latency_p95_ns": 0.0,
            "latency_p99_ns": 0.0,
            "latency_mean_ns": 0.0,
        }
    import numpy as np

    v = np.frombuffer(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(v, [50, 95, 99])
    return {
        "latency_p50_ns": round(float(p50), 1),
        "latency_p95_ns": round(float(p95), 1),
        "latency_p99_ns": round(float(p99), 1),
        "latency_mean_ns": round(float(v.mean()), 1),
    }
