"""The serving metrics of a simulated run: TTFT, ITL, tokens/s, CXL link use, metadata, energy.

A small model on top of the simulator's per-step output (docs/serving.md):

* a decode step serves one token to every context decoding in it, so each of them waits
  the step's time: the **inter-token latency** (ITL) of a user is the time of the steps it
  decodes in, and a user's tokens/s is one over its mean ITL;
* the step's time is the simulator's (HBM reads of the hits, stalls of the misses, the
  optional compute model; Simulated) plus, when the model is given weights, the time to
  stream them from HBM once per step (memory-bound decode; Analytical model);
* a turn's **time to first token** (TTFT) is its prefill's compute time (2 FLOP per
  parameter per prompt token at a stated GPU throughput; Analytical model) plus the time
  of the first step it decodes in (which pays for paging its context back in);
* **CXL link utilisation** is the bytes that crossed the link (every move between HBM and
  the device's tiers) over what the link could carry in the measured time;
* the **metadata footprint** is the device's per-entry policy record
  (:func:`kvcxl.firmware.fixedpoint.record_fields`, the RTL's record) times the entries
  tracked: device SRAM holds the records of HBM-resident entries (the ones the eviction
  engine ranks), device DRAM every tracked entry's (persistent metadata);
* **energy per token** prices the bytes moved and the GPU's time with the inputs of
  :data:`INPUTS` (Analytical model: none of them is measured by this project).

A scaled-down run stands for a larger deployment (the user-count experiment,
:mod:`kvcxl.experiments.users`) through :class:`ServingModel`'s scales: bytes and
entries are multiplied back, prompt tokens too; its tier bandwidths are scaled down by
the caller so that every transfer takes the time it would take at full size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from kvcxl.firmware.fixedpoint import record_fields

from .metrics import mean_ci, percentiles
from .shape import Deployment, ModelShape
from .timing import HBM, NVME

SIMULATED = "Simulated"
ANALYTICAL = "Analytical model"
# A result computed from simulated counts priced with analytic inputs.
SIMULATED_AND_ANALYTICAL = "Simulated counts × Analytical model inputs"


class Input(NamedTuple):
    """One analytic input: the value used, its unit and where it comes from."""

    value: float
    unit: str
    what: str
    source: str


#: The analytic inputs of the serving metrics: the one table (docs/serving.md prints it).
INPUTS: dict[str, Input] = {
    "hbm_pj_per_bit": Input(
        3.9,
        "pJ/bit",
        "HBM access energy (array + I/O)",
        "O'Connor et al., Fine-Grained DRAM, MICRO 2017: HBM2 about 3.9 pJ/bit; HBM3e "
        "assumed no worse",
    ),
    "dram_pj_per_bit": Input(
        15.0,
        "pJ/bit",
        "device DRAM access energy (DDR5 behind the CXL controller)",
        "assumption: DDR4/DDR5 DIMM access energy is commonly quoted at 15-22 pJ/bit; the "
        "low end, as a controller-attached DIMM has short traces",
    ),
    "link_pj_per_bit": Input(
        5.0,
        "pJ/bit",
        "CXL link (PCIe Gen5 PHY), both ends, per bit crossing",
        "assumption: published 32 GT/s SerDes run at about 2-6 pJ/bit per end; "
        "the upper end for the pair",
    ),
    "nvme_active_w": Input(
        25.0,
        "W",
        "NVMe drive power while transferring at its full bandwidth",
        "assumption: PCIe Gen5 x4 enterprise drives specify 20-25 W maximum active power; "
        "the energy per bit is this power over the drive bandwidth of emu/timing.py",
    ),
    "gpu_power_w": Input(
        1000.0,
        "W",
        "GPU board power while decoding (includes its HBM)",
        "NVIDIA B200 (HGX B200) TDP 1000 W; the board is assumed at TDP throughout",
    ),
    "gpu_bf16_tflops": Input(
        2250.0,
        "TFLOP/s",
        "GPU dense BF16 throughput for prefill",
        "NVIDIA HGX B200 datasheet: 4.5 PFLOP/s FP16/BF16 with 2:4 sparsity, half dense",
    ),
    "prefill_mfu": Input(
        0.5,
        "fraction",
        "share of the peak throughput a prefill achieves",
        "assumption: large-batch prefill of a 70B model typically reaches 40-60 % MFU",
    ),
}


def inputs_markdown() -> str:
    """The :data:`INPUTS` table as markdown (docs/serving.md quotes it verbatim)."""
    lines = ["| input | value | unit | what | source |", "|---|---|---|---|---|"]
    for name, i in INPUTS.items():
        lines.append(f"| `{name}` | {i.value:g} | {i.unit} | {i.what} | {i.source} |")
    return "\n".join(lines)


def nvme_pj_per_bit(nvme_gbps: float = NVME.bandwidth_gbps) -> float:
    """NVMe energy per bit: the drive's active power over its bandwidth (GB/s = B/ns)."""
    return INPUTS["nvme_active_w"].value / (nvme_gbps * 1e9 * 8) * 1e12


@dataclass(frozen=True)
class ServingModel:
    """What turns a simulated run into serving metrics, and how it scales to full size.

    ``weights_bytes``: model weights streamed from HBM once per decode step (0: none, the
    step is the simulator's alone); ``params``: model parameters, for the prefill's
    FLOPs; ``hbm_gbps``: the full-size HBM bandwidth the weights stream at.
    ``byte_scale``, ``entry_scale``, ``token_scale``: full-size bytes, entries and prompt
    tokens per simulated one (1 for a run that is its own size).
    """

    weights_bytes: int = 0
    params: float = 0.0
    hbm_gbps: float = HBM.bandwidth_gbps
    byte_scale: float = 1.0
    entry_scale: float = 1.0
    token_scale: float = 1.0

    @classmethod
    def for_deployment(
        cls, shape: ModelShape, full: ModelShape, dep: Deployment, hbm_gbps: float
    ) -> ServingModel:
        """``shape`` simulated standing for ``full`` (e.g. S1) served as in ``dep``."""
        return cls(
            weights_bytes=dep.weights_bytes,
            params=dep.weights_bytes / full.dtype_bytes,
            hbm_gbps=hbm_gbps,
            byte_scale=full.context_bytes / shape.context_bytes,
            entry_scale=full.entries_per_context / shape.entries_per_context,
            token_scale=full.context_tokens / shape.context_tokens,
        )

    def weights_ns(self) -> float:
        """Streaming the weights once (a decode step's compute floor; Analytical model)."""
        return self.weights_bytes / self.hbm_gbps

    def prefill_ns(self, tokens: float) -> float:
        """Prefill of ``tokens`` simulated prompt tokens: 2 FLOP per parameter per token."""
        flops = 2.0 * self.params * tokens * self.token_scale
        rate = INPUTS["gpu_bf16_tflops"].value * 1e12 * INPUTS["prefill_mfu"].value
        return flops / rate * 1e9


def turn_starts(decode: Sequence[Iterable[int]], prefill: Sequence[dict[int, int]]) -> list:
    """(step, context, prefill tokens) of every turn: a context decoding in a step that did
    not decode in the step before, or one that is given a prefill (a new message)."""
    out = []
    before: set[int] = set()
    for step, ctxs in enumerate(decode):
        now = set(ctxs)
        for c in sorted(now):
            if c not in before or c in prefill[step]:
                out.append((step, c, int(prefill[step].get(c, 0))))
        before = now
    return out


def workload_turns(workload: Any, steps: int) -> list[tuple[int, int, int]]:
    """The turns of a workload's first ``steps`` steps (its scheduler, without compiling)."""
    decode, prefill = [], []
    for plan in workload.plans(steps):
        decode.append(plan.decode)
        prefill.append({c: t for c, t, _parent in plan.prefill})
    return turn_starts(decode, prefill)


def serving_metrics(
    result: dict[str, Any],
    model: ServingModel | None = None,
    turns: Sequence[tuple[int, int, int]] | None = None,
) -> dict[str, Any]:
    """The serving metrics of one simulated run (``simulate()``'s result).

    ``turns``: (read step, context, prompt tokens) of the turns (:func:`workload_turns`;
    None for a trace: no TTFT).  ITL, tokens/s, link use and energy cover the measured
    steps (warm-up excluded); TTFT covers every turn, warm-up included (a first turn
    starts in it).  Each figure's evidence class is in ``evidence``.
    """
    model = model or ServingModel()
    ps = result["per_step"]
    warm = int(result["warmup_steps"])
    step_ns = np.asarray(ps["step_ns"], np.float64) + model.weights_ns()
    tokens = np.asarray(ps["tokens"], np.int64)
    m_ns, m_tok = step_ns[warm:], tokens[warm:]
    decoding = m_tok > 0
    total_ns = float(m_ns.sum())
    # ITL: every decoding user waits the whole step; one sample per (user, step).
    itl = np.repeat(m_ns[decoding], m_tok[decoding])
    itl_ms = itl / 1e6
    out: dict[str, Any] = {
        "itl_ms_mean": float(itl_ms.mean()) if itl.size else None,
        "itl_ms_median": float(np.median(itl_ms)) if itl.size else None,
        **{f"itl_ms_{k}": v for k, v in percentiles(itl_ms).items()},
        "tokens_per_s": float(m_tok.sum()) / (total_ns * 1e-9) if total_ns > 0 else None,
        "tokens_per_s_per_user": 1e9 / float(itl.mean()) if itl.size else None,
        "users_mean": float(m_tok[decoding].mean()) if decoding.any() else 0.0,
    }
    out.update(_link_bound(result, m_ns, m_tok, warm))
    ttft_ms = _ttft_ms(step_ns, model, turns)
    out.update(
        ttft_turns=int(ttft_ms.size),
        ttft_ms_mean=float(ttft_ms.mean()) if ttft_ms.size else None,
        ttft_ms_median=float(np.median(ttft_ms)) if ttft_ms.size else None,
        **{f"ttft_ms_{k}": v for k, v in percentiles(ttft_ms).items()},
    )
    out.update(_link(result, total_ns))
    out.update(_energy(result, model, total_ns, int(m_tok.sum()), int(m_tok[decoding].size)))
    out.update(metadata_of_run(result, model))
    out["evidence"] = {
        "itl, tokens/s, link utilisation": SIMULATED
        + ("" if not model.weights_bytes else " + weight streaming (Analytical model)"),
        "ttft": SIMULATED + (" + prefill (Analytical model)" if model.params else ""),
        "metadata": ANALYTICAL,
        "energy": SIMULATED_AND_ANALYTICAL,
    }
    return out


def _ttft_ms(step_ns: np.ndarray, model: ServingModel, turns) -> np.ndarray:
    """Each turn's prefill, after the prefills that arrived before it in the same step (the
    GPU runs them one after another, in context order), then its first decode step."""
    out = []
    queued_ns, at = 0.0, -1
    for s, _c, p in sorted(turns or ()):
        if s >= step_ns.size:
            continue
        queued_ns = 0.0 if s != at else queued_ns
        at = s
        queued_ns += model.prefill_ns(p)
        out.append((queued_ns + step_ns[s]) / 1e6)
    return np.asarray(out)


def _link_bytes(bytes_moved: dict[str, int]) -> int:
    """Bytes that crossed the CXL link: every move between HBM (or the host) and the device."""
    near, far = {"host", "hbm"}, {"cxl", "nvme"}
    total = 0
    for pair, n in bytes_moved.items():
        a, b = pair.split("->")
        if (a in near and b in far) or (a in far and b in near):
            total += n
    return total


def _link_bound(
    result: dict[str, Any], m_ns: np.ndarray, m_tok: np.ndarray, warm: int
) -> dict[str, Any]:
    """ITL and per-user tokens/s when a step also waits for every byte it moved across the
    link (write-backs included, which the simulator does not time): ``max(T_s, link_s / B)``
    (Analytical model on simulated bytes)."""
    gbps = float(result["timing"]["cxl_gbps"])
    link_ns = np.asarray(
        [_link_bytes(b) / gbps for b in result["per_step"]["bytes_moved"][warm:]], np.float64
    )
    decoding = m_tok > 0
    itl = np.repeat(np.maximum(m_ns, link_ns)[decoding], m_tok[decoding]) / 1e6
    if not itl.size:
        return {"link_bound_itl_ms_p50": None, "link_bound_itl_ms_p99": None,
                "link_bound_tokens_per_s_per_user": None}  # fmt: skip
    p = percentiles(itl)
    return {
        "link_bound_itl_ms_p50": p["p50"],
        "link_bound_itl_ms_p99": p["p99"],
        "link_bound_tokens_per_s_per_user": 1e3 / float(itl.mean()),
    }


def _link(result: dict[str, Any], total_ns: float) -> dict[str, Any]:
    """Link demand over the measured steps: bytes moved / (link GB/s × time) (``link_demand``,
    not a utilisation: it can exceed 1); with the timeline (docs/timeline.md) also the link
    utilisation, the busier link direction's busy time over the run's."""
    crossed = _link_bytes(result["bytes_moved"])
    gbps = float(result["timing"]["cxl_gbps"])
    analytic = crossed / (gbps * total_ns) if total_ns > 0 else None
    tl = result.get("timeline")
    if tl is None:
        return {"link_bytes": crossed, "link_demand": analytic}
    u = tl["utilisation"]
    return {
        "link_bytes": crossed,
        "link_utilisation": max(u["link_rd"], u["link_wr"]),
        "link_demand": analytic,
        **{f"{k}_utilisation": v for k, v in u.items()},
        "demand_queue_ns_mean": tl["queueing"]["demand"]["mean_ns"],
        "late_prefetch_bytes": tl["late_prefetch_bytes"],
        "wasted_prefetch_bytes": tl["wasted_prefetch_bytes"],
        "write_back_bytes": tl["write_back_bytes"],
    }


def _energy(
    result: dict[str, Any], model: ServingModel, total_ns: float, tokens: int, steps: int
) -> dict[str, Any]:
    """Energy per token (Analytical inputs on simulated counts), two ways.

    ``energy_mj_per_token``: the GPU board at its power for the measured time (its HBM
    included) plus what the device spends off the GPU: its DRAM, its NVMe and the link.
    ``data_energy_mj_per_token``: data movement alone (KV and weight reads from HBM, every
    move priced at both ends and on the link) — the share a retention policy changes.
    """
    if tokens == 0:
        return {"energy_mj_per_token": None, "data_energy_mj_per_token": None}
    e = {
        "hbm": INPUTS["hbm_pj_per_bit"].value,
        "host": 0.0,  # a new entry is computed in the GPU: only its write is priced
        "cxl": INPUTS["dram_pj_per_bit"].value,
        "nvme": nvme_pj_per_bit(float(result["timing"]["nvme_gbps"]) * model.byte_scale),
    }
    link = INPUTS["link_pj_per_bit"].value
    s = model.byte_scale * 8  # simulated bytes -> full-size bits
    device_pj = 0.0  # off the GPU: device DRAM, NVMe, link
    moves_pj = 0.0
    for pair, n in result["bytes_moved"].items():
        a, b = pair.split("->")
        crosses = (a in ("host", "hbm")) != (b in ("host", "hbm"))
        off_gpu = (e[a] if a in ("cxl", "nvme") else 0) + (e[b] if b in ("cxl", "nvme") else 0)
        device_pj += n * s * (off_gpu + (link if crosses else 0))
        moves_pj += n * s * (e[a] + e[b] + (link if crosses else 0))
    reads_pj = result["reads"] * result["entry_bytes"] * s * e["hbm"]
    weights_pj = steps * model.weights_bytes * 8 * e["hbm"]
    gpu_j = INPUTS["gpu_power_w"].value * total_ns * 1e-9
    return {
        "energy_mj_per_token": (gpu_j + device_pj * 1e-12) / tokens * 1e3,
        "data_energy_mj_per_token": (reads_pj + weights_pj + moves_pj) * 1e-12 / tokens * 1e3,
    }


def record_bits() -> int:
    """Bits of one entry's policy record on the device (``fixedpoint.record_fields``)."""
    return sum(record_fields().values())


def metadata_footprint(entries_tracked: float, entries_in_hbm: float) -> dict[str, Any]:
    """Device metadata for ``entries_tracked`` entries of which ``entries_in_hbm`` are in HBM.

    SRAM: the records the eviction engine ranks every step (HBM-resident entries);
    DRAM: every tracked entry's record (persistent metadata survives an entry's demotion).
    Records packed at :func:`record_bits` each; the location map is not counted.
    """
    bits = record_bits()
    return {
        "record_bits": bits,
        "metadata_sram_bytes": float(np.ceil(entries_in_hbm * bits / 8)),
        "metadata_dram_bytes": float(np.ceil(entries_tracked * bits / 8)),
    }


def metadata_of_run(result: dict[str, Any], model: ServingModel) -> dict[str, Any]:
    """:func:`metadata_footprint` of a run's entries (at full size through the model)."""
    tracked = result["entries"] * model.entry_scale
    return metadata_footprint(tracked, min(result["budget_entries"] * model.entry_scale, tracked))


def metadata_at(shape: ModelShape, dep: Deployment) -> dict[str, Any]:
    """The footprint of ``dep.users`` full contexts of ``shape`` (Analytical model)."""
    in_hbm = (dep.hbm_bytes - dep.weights_bytes - dep.activations_bytes) // shape.entry_bytes
    tracked = dep.users * shape.entries_per_context
    return {
        "evidence": ANALYTICAL,
        "users": dep.users,
        "entries_tracked": tracked,
        "entries_in_hbm": int(min(in_hbm, tracked)),
        **metadata_footprint(tracked, min(in_hbm, tracked)),
    }


#: Serving metrics averaged over seeds (mean and 95 % CI) by :func:`combine_serving`.
SERVING_MEANS = (
    "tokens_per_s",
    "tokens_per_s_per_user",
    "link_bound_tokens_per_s_per_user",
    "itl_ms_mean",
    "ttft_ms_mean",
    "link_demand",
    # with the timeline (docs/timeline.md)
    "link_utilisation",
    "link_rd_utilisation",
    "link_wr_utilisation",
    "dram_utilisation",
    "nvme_utilisation",
    "demand_queue_ns_mean",
    "energy_mj_per_token",
    "data_energy_mj_per_token",
)


def combine_serving(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Serving metrics over seeds: means with 95 % CIs, and latency percentiles pooled over
    the seeds' medians (each seed's p50/p95/p99, then their median)."""
    row: dict[str, Any] = {"seeds": len(runs)}
    for k in SERVING_MEANS:
        st = mean_ci([r.get(k) for r in runs])
        row[k], row[f"{k}_ci95"] = st["mean"], st["ci95"]
    for lat in ("itl_ms", "ttft_ms", "link_bound_itl_ms"):
        for q in ("median", "p50", "p95", "p99"):
            vals = [r[f"{lat}_{q}"] for r in runs if r.get(f"{lat}_{q}") is not None]
            row[f"{lat}_{q}"] = float(np.median(vals)) if vals else None
    for k in ("record_bits", "metadata_sram_bytes", "metadata_dram_bytes"):
        row[k] = runs[0][k]
    if "evidence" in runs[0]:
        row["evidence"] = runs[0]["evidence"]
    return row


def serving_rows(
    raw: list[dict[str, Any]],
    turns_of: Any = None,
    model: ServingModel | None = None,
) -> list[dict[str, Any]]:
    """Serving metrics of a sweep's raw runs, combined over seeds per (workload, variant,
    budget, policy); ``turns_of(seed)`` gives a seed's turns (None: no TTFT)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    keys: dict[tuple, dict[str, Any]] = {}
    for r in raw:
        key = (r.get("workload"), tuple(sorted(r["variant"].items())), r["budget"], r["policy"])
        turns = turns_of(r["seed"]) if turns_of is not None else None
        groups.setdefault(key, []).append(serving_metrics(r, model, turns))
        keys[key] = {"workload": r.get("workload"), "budget": r["budget"], "policy": r["policy"]}
    return [{**keys[k], **combine_serving(runs)} for k, runs in groups.items()]


def _link_label(rows: list[dict[str, Any]]) -> str:
    """The link column's name.  Without the timeline the figure is demand over capacity (it
    can exceed 1: the analytic model does not time write-backs), not a utilisation."""
    return "link use" if _timed(rows) else "link demand"


def _timed(rows: list[dict[str, Any]]) -> bool:
    """Every row has the timeline's link utilisation (else the link figure is the demand)."""
    return all(r.get("link_utilisation") is not None for r in rows)


def format_serving(rows: list[dict[str, Any]]) -> str:
    """The serving rows as an aligned text table (means over seeds)."""

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    link = _link_label(rows)
    key = "link_utilisation" if _timed(rows) else "link_demand"
    head = (
        f"{'policy':<14}{'budget':>8}{'tok/s':>10}{'tok/s/user':>12}{'ITL p50/p99 ms':>18}"
        f"{'TTFT p50/p99 ms':>19}{link:>12}{'mJ/token':>11}{'metadata SRAM/DRAM B':>24}"
    )
    lines = [head]
    for r in rows:
        meta = f"{r['metadata_sram_bytes']:,.0f}/{r['metadata_dram_bytes']:,.0f}"
        lines.append(
            f"{r['policy']:<14}{r['budget']:>8}{f(r['tokens_per_s'], ',.0f'):>10}"
            f"{f(r['tokens_per_s_per_user'], ',.1f'):>12}"
            f"{f(r['itl_ms_p50'], '.3f') + '/' + f(r['itl_ms_p99'], '.3f'):>18}"
            f"{f(r['ttft_ms_p50'], '.3f') + '/' + f(r['ttft_ms_p99'], '.3f'):>19}"
            f"{f(r[key], '.3f'):>12}{f(r['energy_mj_per_token'], '.3f'):>11}"
            f"{meta:>24}"
        )
    if not _timed(rows):
        lines += _over_demand(rows)
    return "\n".join(lines)


def _over_demand(rows: list[dict[str, Any]]) -> list[str]:
    """Untimed rows whose link demand exceeds 1: the link cannot carry their bytes in the
    run's time, so their tokens/s is not reachable; each with its link-bound throughput
    (every step waits for the bytes it moved: ``link_bound_tokens_per_s_per_user``)."""
    over = [r for r in rows if (r.get("link_demand") or 0) > 1]
    return [
        f"link demand above 1 ({r['policy']} {r['budget']}: {r['link_demand']:.3f}): the link "
        "cannot carry the run's bytes in its time; bounded by it, tok/s/user ≤ "
        f"{r['link_bound_tokens_per_s_per_user']:,.1f} (Analytical model on the simulated "
        "bytes); --timeline queues every transfer"
        for r in over
        if r.get("link_bound_tokens_per_s_per_user") is not None
    ]


def format_timeline(rows: list[dict[str, Any]]) -> str:
    """The timeline's resource use of serving rows (docs/timeline.md; means over seeds)."""

    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.3f}"

    lines = [
        f"{'policy':<14}{'budget':>8}{'link rd':>9}{'link wr':>9}{'dram':>8}{'nvme':>8}"
        f"{'demand queue µs':>17}{'link demand':>19}"
    ]
    for r in rows:
        q = r.get("demand_queue_ns_mean")
        lines.append(
            f"{r['policy']:<14}{r['budget']:>8}{f(r.get('link_rd_utilisation')):>9}"
            f"{f(r.get('link_wr_utilisation')):>9}{f(r.get('dram_utilisation')):>8}"
            f"{f(r.get('nvme_utilisation')):>8}{'—' if q is None else f'{q / 1e3:.2f}':>17}"
            f"{f(r.get('link_demand')):>19}"
        )
    return "\n".join(lines)


def format_versus(setups: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """Serving rows of several setups (the device, host offload ...) as one table."""

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    every = [r for _, rows in setups for r in rows]
    link = _link_label(every)
    key = "link_utilisation" if _timed(every) else "link_demand"
    lines = [
        f"{'setup':<24}{'policy':<12}{'budget':>8}{'tok/s':>11}{'TTFT p50/p99 ms':>19}"
        f"{'ITL p50/p99 ms':>18}{link:>12}"
    ]
    for name, rows in setups:
        for r in rows:
            lines.append(
                f"{name:<24}{r['policy']:<12}{r['budget']:>8}{f(r['tokens_per_s'], ',.0f'):>11}"
                f"{f(r['ttft_ms_p50'], '.3f') + '/' + f(r['ttft_ms_p99'], '.3f'):>19}"
                f"{f(r['itl_ms_p50'], '.3f') + '/' + f(r['itl_ms_p99'], '.3f'):>18}"
                f"{f(r[key], '.3f'):>12}"
            )
    return "\n".join(lines)
