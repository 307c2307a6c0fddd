"""Mooncake's published request traces (FAST'25 release) as arrivals: real concurrency,
prefix reuse and lengths, with per-head attention from the fitted synthetic generator.

The data (``data/mooncake/``, Apache-2.0, attribution in its README.md) is one JSON object
per line: ``timestamp`` (ms from the trace's start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``, the remapped hashes of the prompt's
512-token blocks; equal ids are equal prefix blocks, shared across requests.

The mapping (docs/trace-format.md, "Mooncake arrivals"):

* each request is one context, numbered by its line (0-based); its prompt is
  ``ceil(input_length · token_scale)`` tokens and it decodes
  ``ceil(output_length · token_scale)`` steps (at least one);
* ``token_scale`` defaults to ``block_tokens / 512``: one 512-token hash block becomes one
  KV block of every (layer, KV head), so the same hash is the same entries;
* a request whose first ``k`` hash ids an earlier request holds at the same positions
  starts from that request's first ``k`` blocks (the stream's shared prefix; the hashes
  are prefix hashes: an id names its whole prefix, checked on the files by the tests);
* time: a simulated step decodes one simulated token of every active request, i.e.
  ``1 / token_scale`` real tokens, so it stands for ``itl_ms / token_scale`` ms of the
  trace; a request arriving at ``timestamp`` is admitted (prefilled, then decoding) in
  step ``floor(timestamp / step_ms)``, with no cap on concurrency (continuous batching).
  The concurrency is then the trace's arrival rate times its output lengths times
  ``itl_ms``, as in production at that inter-token latency;
* ``rate`` (default 1) scales the arrival rate: every timestamp is divided by it (the
  trace time-compressed by ``rate``), so a request arrives in step
  ``floor(timestamp / (rate · step_ms))``.  Lengths and prefixes are untouched, so the
  concurrency scales by ``rate`` (Little's law: arrival rate × residence): ``steps``
  steps at ``rate`` r replay the requests of ``r · steps`` steps at rate 1, each decoding
  the same steps, at r times their mean concurrency (up to the requests cut off at the
  window's end);
* ``steps`` simulated steps replay the trace's first ``rate · steps · step_ms`` ms (a
  window from its start, so every earlier request whose prefix a later one shares is in
  it); deterministic: the seed only changes the synthetic attention.
"""

from __future__ import annotations

import functools
import json
import lzma
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..shape import ModelShape
from .base import StepPlan, Turn, Workload

HASH_BLOCK_TOKENS = 512  # the tokens one Mooncake hash id covers (the release's block size)
DATA_DIR = Path(__file__).resolve().parent / "data" / "mooncake"
TRACES: dict[str, str] = {
    "conversation": "conversation_trace.jsonl.xz",
    "synthetic": "synthetic_trace.jsonl.xz",
}
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# The arrival-rate factor's range: from 1/1000 of the trace's rate (one request every few
# minutes) to 1000 times it (the whole hour in under 4 s); outside it a window is empty or
# one step.
RATE_MIN, RATE_MAX = 1e-3, 1e3


class MooncakeError(ValueError):
    """A Mooncake trace file or line that cannot be read, named with its file and line."""


@dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def trace_path(source: str) -> Path:
    """A bundled trace by name (``conversation``, ``synthetic``) or a file path."""
    if source in TRACES:
        return DATA_DIR / TRACES[source]
    p = Path(source)
    if not p.is_file():
        raise MooncakeError(
            f"Mooncake trace {source!r}: no such file (or name one of: {', '.join(TRACES)})"
        )
    return p


def _int(v: Any, where: str, name: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MooncakeError(f"{where}: field {name!r} = {v!r} is not an integer")
    if v < low:
        raise MooncakeError(f"{where}: field {name!r} = {v} is out of range: must be >= {low}")
    return v


def parse_line(text: str, where: str, prev_ts: int = 0) -> Request:
    """One line as a :class:`Request`; ``where`` (``file:line``) names it in every error."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise MooncakeError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise MooncakeError(f"{where}: a line must be a JSON object, not {type(obj).__name__}")
    for f in FIELDS:
        if f not in obj:
            raise MooncakeError(f"{where}: field {f!r} is missing")
    ts = _int(obj["timestamp"], where, "timestamp", 0)
    if ts < prev_ts:
        raise MooncakeError(
            f"{where}: field 'timestamp' = {ts} goes back in time (the line before: {prev_ts})"
        )
    n_in = _int(obj["input_length"], where, "input_length", 1)
    n_out = _int(obj["output_length"], where, "output_length", 0)
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list):
        raise MooncakeError(f"{where}: field 'hash_ids' must be a list of integers")
    for i, h in enumerate(hashes):
        _int(h, where, f"hash_ids[{i}]", 0)
    want = -(-n_in // HASH_BLOCK_TOKENS)
    if len(hashes) != want:
        raise MooncakeError(
            f"{where}: field 'hash_ids' has {len(hashes)} ids; input_length {n_in} needs "
            f"{want} (one per {HASH_BLOCK_TOKENS}-token block)"
        )
    if len(set(hashes)) != len(hashes):
        raise MooncakeError(f"{where}: field 'hash_ids' repeats an id within one request")
    return Request(ts, n_in, n_out, tuple(hashes))


def _lines(path: Path) -> Iterator[str]:
    opener = lzma.open if path.suffix == ".xz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            yield from f
    except (lzma.LZMAError, EOFError, UnicodeDecodeError, OSError) as e:
        raise MooncakeError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def read_requests(source: str | Path) -> tuple[Request, ...]:
    """Every request of a Mooncake trace (a bundled name or a ``.jsonl`` / ``.jsonl.xz``
    path), each line validated; blank lines are skipped."""
    path = trace_path(str(source))
    out: list[Request] = []
    prev = 0
    for n, text in enumerate(_lines(path), 1):
        if not text.strip():
            continue
        r = parse_line(text, f"{path}:{n}", prev)
        prev = r.timestamp_ms
        out.append(r)
    if not out:
        raise MooncakeError(f"{path}: no requests")
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _cached(path: str) -> tuple[Request, ...]:
    return read_requests(path)


def trace_facts(requests: tuple[Request, ...] | list[Request]) -> dict[str, Any]:
    """The trace's own facts, for anyone to check an import: requests, tokens, 512-token
    block reads (each request reads its prompt's blocks once), distinct blocks, and the
    infinite-cache block hit ratio (a hit: a read of a block id seen before)."""
    seen: set[int] = set()
    reads = hits = 0
    for r in requests:
        for h in r.hash_ids:
            reads += 1
            hits += h in seen
            seen.add(h)
    return {
        "requests": len(requests),
        "duration_s": (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1e3
        if requests
        else 0.0,
        "input_tokens": sum(r.input_length for r in requests),
        "output_tokens": sum(r.output_length for r in requests),
        "block_reads": reads,
        "distinct_blocks": len(seen),
        "block_hits": hits,
        "infinite_cache_hit_ratio": hits / reads if reads else 0.0,
    }


class MooncakeArrivals(Workload):
    """Base class: ``trace`` names the bundled file; ``requests=`` replays any other."""

    trace: ClassVar[str] = ""
    # itl_ms: real ms per decoded token (an assumption, not in the data); token_scale: 0
    # means block_tokens / 512 (one hash block = one KV block); rate: the arrival-rate
    # factor (timestamps divided by it), in [RATE_MIN, RATE_MAX].
    defaults = {"itl_ms": 25.0, "token_scale": 0.0, "rate": 1.0}

    def __init__(
        self,
        shape: ModelShape,
        seed: int = 0,
        *,
        requests: tuple[Request, ...] | None = None,
        **params: Any,
    ) -> None:
        super().__init__(shape, seed, **params)
        self.requests = requests if requests is not None else _cached(str(trace_path(self.trace)))
        self.token_scale = float(self.params["token_scale"]) or (
            shape.block_tokens / HASH_BLOCK_TOKENS
        )
        if not 0.0 < self.token_scale <= 1.0:
            raise ValueError(
                f"workload {self.name!r}: token_scale = {self.token_scale} must be in (0, 1]"
            )
        itl = float(self.params["itl_ms"])
        if itl <= 0.0:
            raise ValueError(f"workload {self.name!r}: itl_ms = {itl} must be > 0")
        rate = float(self.params["rate"])
        if not RATE_MIN <= rate <= RATE_MAX:  # also refuses nan
            raise ValueError(
                f"workload {self.name!r}: rate = {rate} is out of range: must be in "
                f"[{RATE_MIN:g}, {RATE_MAX:g}] (the factor the arrival rate is scaled by)"
            )
        self.rate = rate
        self.step_ms = itl / self.token_scale
        self._shared: dict[int, int] = {}

    def arrival_step(self, r: Request) -> int:
        return int(r.timestamp_ms // (self.step_ms * self.rate))

    def scaled(self, tokens: int) -> int:
        return max(1, math.ceil(tokens * self.token_scale))

    def turns(self) -> Iterator[Turn]:
        """Every request in arrival order, with its shared prefix's parent; records the
        shared tokens (:meth:`shared_tokens`)."""
        bt = self.shape.block_tokens
        hash_tokens = HASH_BLOCK_TOKENS * self.token_scale
        owner: dict[int, int] = {}  # hash id -> first request holding it
        for i, r in enumerate(self.requests):
            parent, k = None, 0
            for pos in range(len(r.hash_ids) - 1, -1, -1):
                o = owner.get(r.hash_ids[pos])
                if o is not None:
                    # Prefix hashes: the owner's first pos + 1 ids are ours; checked anyway.
                    k = _common_prefix(self.requests[o].hash_ids, r.hash_ids, pos + 1)
                    parent = o if k else None
                    break
            for h in r.hash_ids:
                owner.setdefault(h, i)
            shared = int(k * hash_tokens) // bt * bt  # whole KV blocks only
            prompt = self.scaled(r.input_length)
            if parent is not None and shared:
                self._shared[i] = shared
            else:
                parent = None
            yield Turn(i, max(0, prompt - shared), self.scaled(r.output_length), parent)

    def shared_tokens(self, session: int) -> int | None:
        return self._shared.get(session)

    def plans(self, steps: int) -> Iterator[StepPlan]:
        """Requests admitted at their arrival step, each decoding its steps; no lane cap."""
        source = self.turns()
        nxt = next(source, None)
        active: dict[int, int] = {}  # context -> decode steps left
        for step in range(steps):
            plan = StepPlan(step)
            while nxt is not None and self.arrival_step(self.requests[nxt.session]) <= step:
                plan.prefill.append((nxt.session, nxt.prefill, nxt.parent))
                active[nxt.session] = nxt.decode
                nxt = next(source, None)
            for c in list(active):
                plan.decode.append(c)
                active[c] -= 1
                if active[c] <= 0:
                    del active[c]
            yield plan

    def window(self, steps: int) -> tuple[Request, ...]:
        """The requests that arrive within ``steps`` steps."""
        return tuple(r for r in self.requests if self.arrival_step(r) < steps)

    def truncated(self, steps: int) -> int:
        """Requests of the window longer than the shape's context (the simulator caps them)."""
        cap = self.shape.context_tokens
        return sum(
            self.scaled(r.input_length) + self.scaled(r.output_length) > cap
            for r in self.window(steps)
        )


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], n: int) -> int:
    k = 0
    while k < n and k < len(a) and a[k] == b[k]:
        k += 1
    return k


class Mooncake(MooncakeArrivals):
    name = "mooncake"
    summary = "Mooncake's production conversation trace (arrivals, lengths, prefix reuse)"
    trace = "conversation"


class MooncakeSynthetic(MooncakeArrivals):
    name = "mooncake-synthetic"
    summary = "Mooncake's published synthetic trace (arrivals, lengths, prefix reuse)"
    trace = "synthetic"


ARRIVALS: dict[str, type[Workload]] = {w.name: w for w in (Mooncake, MooncakeSynthetic)}
