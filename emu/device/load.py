"""Concurrent clients on the device service's socket: a bounded load run.

Each of ``clients`` threads opens its own connection and owns its own HPA range; it
writes a random 64 B … 4 KiB block at a random offset of its range, then reads the same
bytes back and compares them with what it wrote (and with a shadow of its whole range on
every 16th operation).  The run stops at ``ops`` operations per client or after
``seconds``, whichever comes first.  Every round trip is timed (wall clock: Measured).

Errors counted: an ERROR frame, an unexpected flag (unmapped, poisoned), a connection
failure, and every byte that does not read back as written (``mismatched_bytes``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .service import ERROR, READ, READ_REQ, WRITE, WRITE_REQ, Client

RANGE = 1 << 20  # bytes of HPA each client owns


@dataclass
class _Client:
    index: int
    latencies_ns: list[int] = field(default_factory=list)
    ops: int = 0
    errors: int = 0
    mismatched_bytes: int = 0
    first_error: str = ""

    def error(self, what: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"client {self.index}: {what}"


def run_load(
    socket_path: str | Path,
    base: int,
    *,
    clients: int = 16,
    ops: int = 2000,
    seconds: float = 30.0,
    seed: int = 0,
) -> dict:
    """Drive the service at ``socket_path`` (a decoder mapping ``clients`` × 1 MiB from HPA
    ``base``) with ``clients`` concurrent connections; returns the figures."""
    if clients < 1 or ops < 1 or not seconds > 0:
        raise ValueError(f"clients {clients}, ops {ops}, seconds {seconds}: must be >= 1, > 0")
    state = [_Client(i) for i in range(clients)]
    deadline = time.monotonic() + seconds
    start = threading.Barrier(clients + 1)

    def work(st: _Client) -> None:
        rng = np.random.default_rng([seed, st.index])
        lo = base + st.index * RANGE
        shadow = bytearray(RANGE)
        try:
            c = Client(socket_path, timeout=max(seconds, 10.0))
        except OSError as exc:
            st.error(f"connect: {exc}")
            start.wait()
            return
        with c:
            c.write(lo, bytes(RANGE // 2))  # a known start (two frames: ≤ 1 MiB each)
            c.write(lo + RANGE // 2, bytes(RANGE // 2))
            start.wait()
            for i in range(ops):
                if time.monotonic() > deadline:
                    break
                n = int(rng.integers(64, 4097))
                off = int(rng.integers(0, RANGE - n + 1))
                data = rng.bytes(n)
                try:
                    t0 = time.perf_counter_ns()
                    kind, body = c.call(WRITE, WRITE_REQ.pack(lo + off, 0) + data)
                    t1 = time.perf_counter_ns()
                    if kind == ERROR or body[0]:
                        st.error(f"write at +{off:#x}: {body[:80]!r}")
                    shadow[off : off + n] = data
                    kind, body = c.call(READ, READ_REQ.pack(lo + off, n))
                    t2 = time.perf_counter_ns()
                    if kind == ERROR or body[0]:
                        st.error(f"read at +{off:#x}: {body[:80]!r}")
                    else:
                        st.mismatched_bytes += _diff(body[16:], data)
                    st.latencies_ns += [t1 - t0, t2 - t1]
                    if i % 16 == 15:  # the whole range: nobody else's write landed in it
                        got = c.read(lo, RANGE // 2)[0] + c.read(lo + RANGE // 2, RANGE // 2)[0]
                        st.mismatched_bytes += _diff(got, bytes(shadow))
                except (OSError, ValueError) as exc:
                    st.error(f"{type(exc).__name__}: {exc}")
                    return
                st.ops += 1

    threads = [threading.Thread(target=work, args=(st,)) for st in state]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.concatenate([np.asarray(s.latencies_ns, dtype=np.float64) for s in state])
    p50, p99 = (np.percentile(lat, [50, 99]) / 1e3) if lat.size else (None, None)
    total = sum(s.ops for s in state)
    errors = [s.first_error for s in state if s.first_error]
    return {
        "clients": clients,
        "ops_per_client_limit": ops,
        "seconds_limit": seconds,
        "ops": total,
        "round_trips": int(lat.size),
        "wall_s": round(wall, 3),
        "ops_per_s": round(total / wall, 1) if wall else None,
        "round_trips_per_s": round(lat.size / wall, 1) if wall else None,
        "latency_p50_us": None if p50 is None else round(float(p50), 1),
        "latency_p99_us": None if p99 is None else round(float(p99), 1),
        "errors": sum(s.errors for s in state),
        "mismatched_bytes": sum(s.mismatched_bytes for s in state),
        "first_error": errors[0] if errors else None,
        "op": "WRITE 64 B … 4 KiB then READ it back (one op = two round trips)",
        "evidence": "Measured",
    }


def _diff(a: bytes, b: bytes) -> int:
    """Bytes that differ (a length difference counts every missing byte)."""
    n = min(len(a), len(b))
    x = np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n)
    return int(np.count_nonzero(x)) + abs(len(a) - len(b))
