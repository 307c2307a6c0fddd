"""What the experiments share: the three scales, one seed's stream, one arm's replay, and
the per-workload table of arms (docs/validation.md, "Scales" and "Statistics").

Every run replays a synthetic workload compiled for one seed with sparse top-k reads
(``READ``: each KV head reads its 8 most attended blocks per step, Quest-style; with
dense reads every block is read every step and hit rate is a matter of budget alone).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from kvcxl.common.sizes import BYTES, Budget, as_budget
from kvcxl.emu.shape import ModelShape, preset
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import WORKLOADS, compile_workload, make_workload
from kvcxl.emu.workloads.attention import attention_for, attention_source
from kvcxl.firmware.config import PolicyConfig

from .stats import fmt_ci, paired_gain, summary

READ = "topk:8"
#: The programme's workloads first (docs/design.md, "Validation programme"), then the rest.
PROGRAMME_WORKLOADS = ("retrieval", "multi-turn", "shared-prefix", "uniform")
ALL_WORKLOADS = PROGRAMME_WORKLOADS + tuple(w for w in WORKLOADS if w not in PROGRAMME_WORKLOADS)

# Each scale: the model shape (a preset and overrides), steps, warm-up steps excluded from
# every metric, and the workloads it runs (docs/validation.md, "Scales").  "mid": S1's head
# geometry (8 KV heads, GQA groups of 8, 128-dim heads) at 8 layers and 16 K tokens, 300
# steps (β·idle reaches 0.3 at the default β = 0.001, where `ci`'s 200 stay ≤ 0.2).  "s1":
# S1 exactly (80 layers × 8 KV heads × 128 K tokens), 1,000 steps so that β·idle reaches 1
# (1/β, the recency term's horizon), the first 100 warm-up (10 %, as at ci and mid); top-256
# reads, 4,096 tokens per head: mid's 1/32 of the blocks.
SCALES: dict[str, dict[str, Any]] = {
    "tiny": {"preset": "ci", "context_tokens": 512, "steps": 24, "warmup": 4,
             "workloads": ("multi-turn", "uniform")},
    "ci": {"preset": "ci", "steps": 200, "warmup": 20, "workloads": ALL_WORKLOADS},
    "mid": {"preset": "s1", "layers": 8, "context_tokens": 16384, "steps": 300,
            "warmup": 30, "read": "topk:32", "workloads": ALL_WORKLOADS},
    "s1": {"preset": "s1", "steps": 1000, "warmup": 100, "read": "topk:256",
           "workloads": ALL_WORKLOADS},
}  # fmt: skip
_SHAPE_KEYS = ("layers", "q_heads", "kv_heads", "d_head", "block_tokens", "context_tokens")


class LastStream:
    """The last read stream built, with its key, for the runs that share it: a worker runs
    its cases in order, and the cases that share a stream are consecutive (they put what
    only times and places the device innermost).  One is kept, and dropped before the next
    is built: a stream of S1's 16 users is gigabytes, and its build took as long as a
    replay (Measured: 44.8 s of an 83 s run, 10 steps)."""

    def __init__(self) -> None:
        self._last: tuple[Hashable, Any] | None = None

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The stream of ``key``: the kept one, or ``build()``'s once the kept one is gone."""
        if self._last is None or self._last[0] != key:
            self._last = None
            self._last = (key, build())
        return self._last[1]

    def clear(self) -> None:
        self._last = None


def base_cases(scale: str, **extra: Any) -> list[dict[str, Any]]:
    """One case per workload of ``scale``: the flat fields every run needs, plus ``extra``."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}: must be one of {', '.join(SCALES)}")
    s = SCALES[scale]
    fixed = {k: v for k, v in s.items() if k != "workloads"}
    return [{"workload": w, "scale": scale, "read": READ, **fixed, **extra} for w in s["workloads"]]


def shape_of(case: dict[str, Any]) -> ModelShape:
    return preset(case["preset"]).with_(**{k: case.get(k) for k in _SHAPE_KEYS})


@functools.lru_cache(maxsize=2)
def _stream(
    workload: str, seed: int, shape: ModelShape, steps: int, read: str, agg: str,
    attention: str | None,
):  # fmt: skip
    wl = make_workload(workload, shape, seed=seed)
    return compile_workload(
        wl, steps, attention=attention_for(shape, attention), aggregation=agg, read=read
    )


def stream(case: dict[str, Any], seed: int, aggregation: str = "max"):
    """The read stream of ``case`` on workload seed ``seed`` (the last two are kept), with
    the attention its ``attention`` field chooses (none: its preset's own)."""
    return _stream(
        case["workload"], int(seed), shape_of(case), int(case["steps"]), case["read"], aggregation,
        case.get("attention"),
    )  # fmt: skip


def replay(
    st: Any,
    case: dict[str, Any],
    policy: str,
    budget: Budget | str = "10%",
    prefetch: bool = False,
    **config: Any,
) -> dict[str, float]:
    """One arm on one stream: hit rate, effective latency, tokens/s and the per-step stall's
    p50/p95/p99, every one over the steps after the warm-up (Simulated)."""
    r = simulate(
        st,
        SimOptions(
            policy=policy,
            budget_bytes=as_budget(budget, BYTES).resolve(st.kv_bytes),
            config=PolicyConfig.from_mapping(config),
            prefetch=prefetch,
            warmup_steps=int(case["warmup"]),
        ),
    )
    stall = np.asarray(r["per_step"]["stall_ns"][r["warmup_steps"] :], dtype=np.float64)
    p = np.percentile(stall, [50, 95, 99]) if stall.size else [np.nan] * 3
    return {
        "hit_rate": float(r["hit_rate"]),
        "effective_latency_ns": float(r["effective_latency_ns"]),
        "tokens_per_s": float(r["tokens_per_s"]),
        "stall_p50_ns": float(p[0]),
        "stall_p95_ns": float(p[1]),
        "stall_p99_ns": float(p[2]),
    }


def prefixed(arm: str, metrics: dict[str, float]) -> dict[str, float]:
    """An arm's metrics as flat row fields ``arm:metric``."""
    return {f"{arm}:{k}": v for k, v in metrics.items()}


def by_workload(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by workload, in the programme's order, each group sorted by seed."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["workload"], []).append(r)
    order = [w for w in ALL_WORKLOADS if w in out] + [w for w in out if w not in ALL_WORKLOADS]
    return {w: sorted(out[w], key=lambda r: r["seed"]) for w in order}


def column(rows: Sequence[dict[str, Any]], arm: str, metric: str) -> list[float]:
    return [float(r[f"{arm}:{metric}"]) for r in rows]


def arm_table(
    rows: Sequence[dict[str, Any]],
    arms: Sequence[tuple[str, str, str | None]],
    gain_label: str = "gain (pts)",
) -> str:
    """Markdown: one line per arm ``(key, label, compared-to key or None)`` with hit rate
    (mean ± 95 % CI, median), its paired gain over the compared arm, effective latency
    (mean ± CI, median) and the per-step stall's p50/p95/p99 (median over seeds)."""
    head = (
        f"| arm | hit rate % (mean ± 95 % CI) | median | {gain_label} | eff. latency ns "
        "(mean ± CI) | median | stall µs/step p50 / p95 / p99 |\n|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for key, label, ref in arms:
        hr = summary(column(rows, key, "hit_rate"))
        lat = summary(column(rows, key, "effective_latency_ns"))
        gain = "—"
        if ref is not None:
            g = paired_gain(column(rows, key, "hit_rate"), column(rows, ref, "hit_rate"))
            gain = fmt_ci(g, 100, 1, sign=True)
        st = [np.median(column(rows, key, f"stall_{q}_ns")) / 1e3 for q in ("p50", "p95", "p99")]
        lines.append(
            f"| {label} | {fmt_ci(hr, 100)} | {hr['median'] * 100:.1f} | {gain} | "
            f"{fmt_ci(lat, 1, 0)} | {lat['median']:.0f} | "
            f"{st[0]:.1f} / {st[1]:.1f} / {st[2]:.1f} |"
        )
    return "\n".join(lines)


def titled(workload: str, rows: Sequence[dict[str, Any]], table: str) -> str:
    """A workload's table under its name and what it was run with."""
    return f"**{workload}** — {seeds_note(rows)}\n\n{table}"


def seeds_note(rows: Sequence[dict[str, Any]]) -> str:
    seeds = sorted({r["seed"] for r in rows})
    case = rows[0]
    return (
        f"Simulated, scale `{case['scale']}` (preset {case['preset']}, "
        f"{case.get('layers') or shape_of(case).layers} layers, "
        f"{shape_of(case).context_tokens} tokens), {case['steps']} steps of which the first "
        f"{case['warmup']} are warm-up (excluded), reads {case['read']}, {len(seeds)} seeds "
        f"({seeds[0]}–{seeds[-1]}); attention: {attention_of(case)}."
    )


def attention_summary(rows: Sequence[dict[str, Any]]) -> str:
    """Every attention source among ``rows``' cases, for a table over several workloads."""
    return "; ".join(dict.fromkeys(attention_of(r) for r in rows))


def attention_of(case: dict[str, Any]) -> str:
    """Where a case's attention came from, as every table's caption says (a captured trace
    is the real model's; a synthetic stream's is the case's ``attention`` choice, or its
    shape's preset's own)."""
    if "trace" in case:
        return "captured from SmolLM2-135M (real)"
    shape = shape_of(case)
    return f"synthetic, {attention_source(shape.name, case.get('attention'), shape.layers)}"
