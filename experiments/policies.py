"""Which policy should the device run? Every registered online policy ranked on every
workload, with Belady's offline optimum as the bound (docs/validation.md, "policies").

The policies come from the firmware's registry (:data:`kvcxl.firmware.policies.POLICIES`):
every online one that is not an ablation-ladder variant, so a policy added later joins the
ranking without an edit here.  The workloads: every synthetic one of the scale, Mooncake's
two published traces as arrivals (``mooncake``, ``mooncake-synthetic``: the first
``steps`` steps of each, a context long enough that no request is cut), and SmolLM2 captures
when ``KVCXL_CAPTURES`` names a folder of ``.npz`` traces (``kvcxl trace capture``; a
capture is one Measured trace, so its seeds replay the same stream and its CI is 0).

Beside them, the arms of :data:`CONFIGURED`: a policy with a configuration (the seed's EMA
with the values ``kvcxl calibrate`` fits, ``firmware/calibrated.toml``), one row each.  The
seed's literal EMA at the defaults stays the baseline every margin is taken against; the
verdict asks whether any arm of the EMA's family (the baseline, its configured arms, and
every registered subclass of its policy) is beaten.
"""

from __future__ import annotations

import functools
import os
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from kvcxl.common.figures import figure
from kvcxl.emu.shape import preset
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads import ARRIVALS, from_trace
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES

from ._common import (
    SCALES,
    arm_table,
    attention_summary,
    base_cases,
    by_workload,
    column,
    prefixed,
    replay,
    titled,
)
from ._common import stream as case_stream
from .base import Experiment
from .stats import excludes_zero, fmt_ci, paired_gain, summary

BASELINE = "ema"  # the seed's policy, which every margin is taken against
BOUND = "belady"  # the offline optimum that may bypass: the upper bound of every online policy
BUDGET = "10%"
CAPTURES_ENV = "KVCXL_CAPTURES"
CAPTURE = "capture:"  # a captured trace's workload name: CAPTURE + its file's stem
# Mooncake's longest request at the default token scale (block_tokens / 512) is 5,981 + 1
# tokens (the synthetic trace; the conversation trace's 3,944 + 11): 8 K holds both.
ARRIVAL_CONTEXT_TOKENS = {"tiny": 8192, "ci": 8192, "mid": 16384, "s1": 16384}
#: An arrival case reads at most this share of its context's blocks per head, the share
#: mid's and s1's top-k read of theirs (1/32: top-32 of 1,024 blocks, top-256 of 8,192).
#: s1's top-256 would read a Mooncake context whole: at 16 K tokens it has 1,024 blocks,
#: and the longest request fills 374 of them (the synthetic trace's; the conversation's 248).
ARRIVAL_READ_SHARE = 1 / 32
_ROOT = Path(__file__).resolve().parents[1]
#: The configuration ``kvcxl calibrate`` writes (docs/calibration.md, section 5), committed.
CALIBRATED = "firmware/calibrated.toml"

#: Arms that are a policy with a configuration: label → (registered policy, the overrides
#: of the defaults: a TOML file under the repository's root, as ``--config`` reads it, or
#: a mapping of parameters).  One more arm is one more row; its label names it in every
#: table, so it must say what it is.
CONFIGURED: dict[str, tuple[str, str | dict[str, Any]]] = {
    "ema (calibrated)": (BASELINE, CALIBRATED),
    # the variant of the EMA's own rules that `kvcxl experiment ema-variants` names best
    "ema (best variant)": (BASELINE, {"touch_threshold": 0.001}),
}


def ranked_policies() -> list[str]:
    """Every online, non-ablation policy of the registry, sorted, then the bound."""
    online = sorted(p for p, c in POLICIES.items() if c.online and not c.ablation)
    return [*online, BOUND]


def capture_files() -> list[Path]:
    """The ``.npz`` traces in ``$KVCXL_CAPTURES`` (none when unset), sorted by name."""
    d = os.environ.get(CAPTURES_ENV)
    if not d:
        return []
    p = Path(d)
    if not p.is_dir():
        raise ValueError(f"{CAPTURES_ENV}={d!r}: not a folder of captured traces (.npz)")
    return sorted(p.glob("*.npz"))


def arm_config(source: str | dict[str, Any]) -> dict[str, Any]:
    """An arm's parameters as a flat mapping, checked as ``--config`` checks them: a TOML
    file's keys (at the top level or under ``[policy]``), or the mapping itself."""
    if isinstance(source, dict):
        values = dict(source)
    else:
        data = tomllib.loads((_ROOT / source).read_text())
        values = data["policy"] if isinstance(data.get("policy"), dict) else data
    PolicyConfig.from_mapping(values)  # refuses an unknown key or a value out of range
    return values


def configured_arms() -> list[list[Any]]:
    """:data:`CONFIGURED` resolved as a case carries it (flat: lists, no mappings), so that
    a changed file or row runs its arm again: ``[label, policy, [[key, value], ...]]``."""
    for label, (policy, _) in CONFIGURED.items():
        if policy not in POLICIES or label in POLICIES:
            raise ValueError(f"arm {label!r}: policy {policy!r} unknown or label taken")
    return [
        [label, policy, [[k, v] for k, v in arm_config(src).items()]]
        for label, (policy, src) in CONFIGURED.items()
    ]


def arms_of(case: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """A case's configured arms: label → (policy, its parameters)."""
    return {label: (policy, dict(items)) for label, policy, items in case.get("arms", [])}


def family(rows_or_case: dict[str, Any]) -> list[str]:
    """The arms of the EMA's family in a case: the baseline, its configured arms and every
    registered policy derived from the baseline's (e.g. ``ema-floor``)."""
    base = POLICIES[BASELINE]
    out = [p for p in rows_or_case["policies"] if p in POLICIES and issubclass(POLICIES[p], base)]
    arms = arms_of(rows_or_case)
    out += [a for a, (p, _) in arms.items() if issubclass(POLICIES[p], base)]
    return sorted(out, key=lambda a: (a != BASELINE, a))


@functools.lru_cache(maxsize=2)
def _trace_stream(path: str):
    return from_trace(Trace.load(path))


def _arrival_read(read: str, scale: str) -> str:
    """The scale's read for an arrival case, its top-k cut to ARRIVAL_READ_SHARE of the
    arrival context's blocks (only s1's is cut: top-256 → top-32)."""
    mode, _, k = read.partition(":")
    if mode != "topk":
        return read
    tokens = ARRIVAL_CONTEXT_TOKENS[scale]
    blocks = -(-tokens // preset(SCALES[scale]["preset"]).block_tokens)
    return f"topk:{min(int(k), max(1, round(blocks * ARRIVAL_READ_SHARE)))}"


class Policies(Experiment):
    name = "policies"
    required_arms = (BASELINE, BOUND)  # the margins' baseline and the bound
    question = (
        "Which policy should the device run on each workload, by how much does it beat the "
        "seed's EMA, and how far is it from Belady's optimum?"
    )
    claim = (
        "The attention-aware EMA is the policy the device should run (the design's choice; "
        "Appendix N's provisional finding: no policy dominates every workload)"
    )

    def cases(self, scale: str) -> list[dict[str, Any]]:
        extra = {"budget": BUDGET, "policies": ranked_policies(), "arms": configured_arms()}
        out = base_cases(scale, **extra)
        fixed = {k: v for k, v in SCALES[scale].items() if k != "workloads"}
        read = _arrival_read(out[0]["read"], scale)
        for wl in ARRIVALS:
            out.append({"workload": wl, "scale": scale, **fixed, "read": read,
                        "context_tokens": ARRIVAL_CONTEXT_TOKENS[scale], **extra})  # fmt: skip
        for f in capture_files():
            out.append({"workload": f"{CAPTURE}{f.stem}", "trace": str(f.resolve()),
                        "scale": scale, "read": "trace", **fixed, **extra})  # fmt: skip
        return out

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        if "trace" in case:
            st = _trace_stream(case["trace"])
            # A capture's steps are its own: the warm-up is the scale's share of them.
            n = st.n_steps
            case = {**case, "warmup": n * int(case["warmup"]) // int(case["steps"])}
        else:
            st = case_stream(case, seed)
        out: dict[str, Any] = {}
        for p in case["policies"]:
            out |= prefixed(p, replay(st, case, p, case["budget"]))
        for label, (p, config) in arms_of(case).items():
            out |= prefixed(label, replay(st, case, p, case["budget"], **config))
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups = by_workload(rows)
        tables, ranking = [], []
        for wl, rs in groups.items():
            order = sorted(
                online_arms(rs[0]), key=lambda p: -float(np.mean(column(rs, p, "hit_rate")))
            )
            arms = [(BOUND, f"{BOUND} (offline bound)", BASELINE)]
            arms += [(p, p, None if p == BASELINE else BASELINE) for p in order]
            tables.append(titled(wl, rs, arm_table(rs, arms, f"over {BASELINE} (pts)")))
            ranking.append(_rank(wl, rs, order))
        verdict, why = _verdict(ranking)
        if not any(wl.startswith(CAPTURE) for wl in groups):  # (say what did not join)
            why += (
                f" No SmolLM2 capture joined: {CAPTURES_ENV} names none (a folder of "
                "`kvcxl trace capture` traces)."
            )
        head = [_arms_note(rows[0]), _ranking_table(ranking), _family_table(ranking)]
        return {
            "tables": [*head, _matrix(groups), *tables],
            "caption": f"Simulated, every workload of the tables below; attention: "
            f"{attention_summary(rows)}.",
            "verdict": verdict,
            "why": why,
            "plots": {"policies.png": lambda path: _plot(groups, path)},
            "ranking": ranking,
        }


def online_arms(case: dict[str, Any]) -> list[str]:
    """Every online arm of a case: its registry policies, then its configured arms."""
    return [p for p in case["policies"] if p != BOUND] + list(arms_of(case))


def _arms_note(case: dict[str, Any]) -> str:
    """What each configured arm is: its policy and the parameters it sets apart from the
    defaults (every other arm is a registered policy at its defaults)."""
    default = PolicyConfig().effective()
    lines = []
    for label, (policy, config) in arms_of(case).items():
        src = CONFIGURED.get(label, (policy, None))[1]
        where = f" (`--config {src}`)" if isinstance(src, str) else ""
        moved = [f"{k} = {_short(v)}" for k, v in config.items() if default.get(k) != v]
        lines.append(f"- **{label}**: `{policy}`{where} with {', '.join(moved) or 'the defaults'}")
    arms = "\n".join(lines) or "- none"
    every = ranked_policies()
    ran = [p for p in case["policies"] if p != BOUND]
    which = (
        "Every online policy of the registry"
        if case["policies"] == every
        else f"{len(ran)} of the registry's {len(every) - 1} online policies ({', '.join(ran)}; "
        "the rest left out with `--arms`)"
    )
    return (
        f"**Arms.** {which} at their defaults (`{BASELINE}` is the seed's literal EMA, the "
        f"baseline of every margin), `{BOUND}` as the bound, and these configured arms:"
        f"\n\n{arms}"
    )


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | tuple):
        return "/".join(_short(x) for x in v)
    return str(v)


def _rank(wl: str, rs: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """One workload's answer: the best online arm, its lead over the runner-up and its
    margin over the EMA (paired, with CIs), the EMA's rank and the gap to the bound; and
    for the EMA's family, each arm's rank and gain over the EMA, and the best arm's margin
    over the family's best."""
    best, second = order[0], order[1] if len(order) > 1 else order[0]
    hit = lambda p: column(rs, p, "hit_rate")  # noqa: E731
    mean = {p: float(np.mean(hit(p))) for p in order}
    rank = lambda a: 1 + sum(m > mean[a] for m in mean.values())  # noqa: E731  (ties share)
    fam = [a for a in family(rs[0]) if a in order]
    top = min(fam, key=order.index) if fam else None
    return {
        "workload": wl,
        "best": best,
        "best_hit": summary(hit(best)),
        "runner_up": second,
        "lead": paired_gain(hit(best), hit(second)),
        "over_ema": paired_gain(hit(best), hit(BASELINE)),
        "ema_rank": rank(BASELINE) if BASELINE in order else None,
        "policies": len(order),
        "to_bound": paired_gain(hit(BOUND), hit(best)),
        "seeds": len(rs),
        "family": {
            a: {"rank": rank(a), "over_ema": paired_gain(hit(a), hit(BASELINE))} for a in fam
        },
        "best_of_family": top,
        "over_family": paired_gain(hit(best), hit(top)) if top else None,
    }


def _ranking_table(ranking: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | best online arm | its hit rate % | lead over runner-up (pts) | "
        f"margin over {BASELINE} (pts) | {BASELINE}'s rank | Belady − best (pts) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ranking:
        lines.append(
            f"| {r['workload']} | {r['best']} | {fmt_ci(r['best_hit'], 100)} | "
            f"{fmt_ci(r['lead'], 100, 1, sign=True)} over {r['runner_up']} | "
            f"{fmt_ci(r['over_ema'], 100, 1, sign=True)} | {r['ema_rank']} of {r['policies']} | "
            f"{fmt_ci(r['to_bound'], 100, 1, sign=True)} |"
        )
    return (
        "**Ranking** — Simulated, hit rate at a 10 % HBM budget, mean ± 95 % CI over seeds; "
        "margins are paired per seed.\n\n" + "\n".join(lines)
    )


def _family_table(ranking: list[dict[str, Any]]) -> str:
    """The EMA's family on each workload: every arm's gain over the literal EMA and its rank,
    and how far the best online arm is ahead of the family's best."""
    arms = [a for a in ranking[0]["family"] if a != BASELINE] if ranking else []
    head = " | ".join(f"{a} − {BASELINE} (pts), rank" for a in arms)
    lines = [
        f"| workload | {BASELINE}'s rank | {head} | best of the family | best online arm − "
        "best of the family (pts) |",
        "|---|---|" + "---|" * len(arms) + "---|---|",
    ]
    for r in ranking:
        fam = r["family"]
        cells = " | ".join(
            f"{fmt_ci(fam[a]['over_ema'], 100, 1, sign=True)}, {fam[a]['rank']} of {r['policies']}"
            if a in fam
            else "—"
            for a in arms
        )
        gap = "—" if r["over_family"] is None else fmt_ci(r["over_family"], 100, 1, sign=True)
        lines.append(
            f"| {r['workload']} | {r['ema_rank']} of {r['policies']} | {cells} | "
            f"{r['best_of_family']} | {gap} ({r['best']}) |"
        )
    return (
        f"**The EMA's family** — Simulated; the seed's literal {BASELINE}, its configured arms "
        "and the registered policies derived from it; gains paired per seed, mean ± 95 % CI."
        "\n\n" + "\n".join(lines)
    )


def _matrix(groups: dict[str, list[dict[str, Any]]]) -> str:
    """Hit rate % of every arm on every workload (mean over seeds), the EMA's family first,
    then the rest by mean rank, the bound last; the best online arm(s) in bold."""
    wls = list(groups)
    case = groups[wls[0]][0]
    means = {w: {a: float(np.mean(column(rs, a, "hit_rate"))) * 100
                 for a in [*online_arms(rs[0]), BOUND]} for w, rs in groups.items()}  # fmt: skip
    fam = family(case)
    rest = [a for a in online_arms(case) if a not in fam]
    rank = {a: np.mean([sorted(means[w].values(), reverse=True).index(means[w][a])
                        for w in wls]) for a in rest}  # fmt: skip
    cols = [*fam, *sorted(rest, key=lambda a: (rank[a], a)), BOUND]
    lines = ["| workload | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for w in wls:
        top = max(means[w][a] for a in cols if a != BOUND)
        cells = []
        for a in cols:
            v = f"{means[w][a]:.1f}"
            cells.append(f"**{v}**" if a != BOUND and v == f"{top:.1f}" else v)
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return (
        "**Hit rate % of every arm** — Simulated, mean over the seeds (the CIs are in each "
        "workload's table below); the best online arm in bold (ties at the precision shown)."
        "\n\n" + "\n".join(lines)
    )


def _verdict(ranking: list[dict[str, Any]]) -> tuple[str, str]:
    """Judged on the EMA's family, fairly: confirms when the best arm of the family is best
    or tied (the best arm's margin over it includes 0) on every workload; contradicts when
    another policy beats every arm of the family (CI excluding 0) on most workloads.  The
    literal EMA's count is said beside it."""
    fam = [r for r in ranking if r["over_family"] is not None]
    beaten = [r for r in fam if excludes_zero(r["over_family"])]
    literal = [r for r in ranking if r["best"] != BASELINE and excludes_zero(r["over_ema"])]
    leaders = sorted({r["best"] for r in ranking})
    where = lambda rs: ", ".join(f"{r['workload']}: {r['best']}" for r in rs) or "none"  # noqa: E731
    arms = sorted({a for r in ranking for a in r["family"]}, key=lambda a: (a != BASELINE, a))
    better = {
        a: [r["workload"] for r in ranking
            if a in r["family"] and r["family"][a]["over_ema"]["mean"] > 0
            and excludes_zero(r["family"][a]["over_ema"])]
        for a in arms if a != BASELINE
    }  # fmt: skip
    gains = "; ".join(f"{a} beats {BASELINE} on {len(w)} ({', '.join(w) or 'none'})"
                      for a, w in better.items())  # fmt: skip
    why = (
        f"The seed's literal {BASELINE} is beaten with a CI excluding 0 on {len(literal)} of "
        f"{len(ranking)} workloads ({where(literal)}); the best arm of its family "
        f"({', '.join(arms)}) on {len(beaten)} of {len(ranking)} ({where(beaten)})"
        + (f"; {gains}" if gains else "")
        + f". The leaders are {', '.join(leaders)}."
    )
    if any(r["over_family"].get("ci95") is None for r in fam if r["best"] not in r["family"]):
        return "cannot say", why + " (one seed: no confidence interval)"
    if not beaten:
        return "confirms", why
    if 2 * len(beaten) > len(ranking):
        return "contradicts", why
    return "cannot say", why


def _plot(groups: dict[str, list[dict[str, Any]]], path: str) -> None:
    wls = list(groups)
    case = groups[wls[0]][0]
    pols = [*online_arms(case), BOUND]
    size = (1.0 + 0.8 * len(pols), 0.9 + 0.45 * len(wls))
    with figure(path, tight=True, figsize=size) as (fig, ax):
        _draw(groups, wls, pols, fig, ax)


def _draw(
    groups: dict[str, list[dict[str, Any]]], wls: list[str], pols: Any, fig: Any, ax: Any
) -> None:
    m = np.array([[np.mean(column(groups[w], p, "hit_rate")) * 100 for p in pols] for w in wls])
    im = ax.imshow(m, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for i in range(len(wls)):
        best = max((j for j, p in enumerate(pols) if p != BOUND), key=lambda j: m[i, j])
        for j in range(len(pols)):
            weight = "bold" if j == best else "normal"
            ax.text(j, i, f"{m[i, j]:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if m[i, j] < 60 else "black", fontweight=weight)  # fmt: skip
    ax.set_xticks(range(len(pols)), pols, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(wls)), wls, fontsize=8)
    fig.colorbar(im, ax=ax, label="hit rate % (mean over seeds)")
    ax.set_title("Policies by workload (bold: best online)", fontsize=9)
    ax.text(1.0, -0.02, "Simulated", transform=ax.transAxes, ha="right", va="top",
            fontsize=7, color="gray")  # fmt: skip


EXPERIMENT = Policies()
