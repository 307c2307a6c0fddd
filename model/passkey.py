"""End-task quality: passkey retrieval by SmolLM2-135M under each policy's bounded KV cache.

The task (after Mohtashami & Jaggi's passkey test and the needle-in-a-haystack probes of
RULER): a filler text of at least ``min_tokens`` tokens hides one sentence with a
numeric pass key at a given depth, and the prompt ends by asking for it.  Prompts are
generated from a seed (:func:`generate`), so every run gets the same set.  An answer is
correct when the first run of digits in the decoded answer is the pass key (:func:`score`).

Per prompt (:func:`run_prompt`):

1. **Prefill once, full cache.**  The prompt and a greedy answer of ``answer_tokens``
   tokens run with the whole cache (:func:`kvcxl.model.capture.capture`), recording
   every position's block attention: the captured trace.
2. **The full-cache answer** is decoded again from the last prompt position with the
   full cache (the reference every policy is compared against).
3. **Each policy × budget**: a :class:`~kvcxl.model.quality.BoundedCache` of
   ``budget`` (a fraction of the prompt's KV blocks per KV head, one pool over every
   layer and head) is told the prefill positions ``0 … P−2`` in order, as the simulator
   would: each block is written when its first position comes, and each position reads
   every resident entry with the attention the full-cache prefill paid it; the policy
   evicts (drops) as the pool overflows.  Then the answer is decoded greedily from the
   last prompt position ``P−1`` on with only the resident blocks visible (the keys and
   values computed by the full prefill; each answer position's own keys are computed
   under the bounded cache), the policy still observing and evicting.
4. **Hit rate** of the same policy and budget on the captured trace (prompt + answer),
   replayed with demand paging (:func:`kvcxl.model.calibrate.replay_hit_rate`).

Accuracy is Measured (the real model decodes); the hit rate is Simulated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcxl.common.figures import figure
from kvcxl.emu.metrics import mean_ci, wilson_ci

from .calibrate import replay_hit_rate
from .capture import capture
from .quality import BoundedCache, PolicySpec, budget_overrides

#: Neutral filler sentences; a prompt's filler is drawn from them with its own seed.
FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The river runs to the sea.",
    "Birds sing in the morning.",
    "The road is long and quiet.",
    "A cat sleeps by the door.",
    "Rain falls on the hills.",
    "The wind moves the trees.",
    "Bread is baked in the oven.",
    "The train leaves at noon.",
    "Children play in the park.",
    "The moon rises at night.",
    "Snow covers the mountains.",
    "The market opens early.",
    "A boat drifts on the lake.",
    "The library is closed today.",
    "Leaves turn red in autumn.",
)
INTRO = (
    "There is an important pass key hidden inside a lot of irrelevant text. "
    "Find it and memorize it.\n\n"
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\n\nWhat is the pass key? The pass key is"
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class PasskeyPrompt:
    """One generated prompt: its pass key, where the needle sits, and its tokens."""

    index: int
    depth: float  # the requested depth: the needle follows this fraction of the filler
    passkey: str
    tokens: list[int]
    needle_token: int  # token offset of the needle sentence in the prompt

    @property
    def measured_depth(self) -> float:
        return self.needle_token / len(self.tokens)


def _text(sentences: Sequence[str], depth: float, key: str) -> tuple[str, str]:
    """(the prompt, its text before the needle) with the needle after ``depth`` of the filler."""
    k = round(len(sentences) * depth)
    before = INTRO + " ".join(sentences[:k]) + (" " if k else "")
    rest = " ".join([NEEDLE.format(key=key), *sentences[k:]])
    return before + rest + QUESTION, before


def generate(
    tok: Any,
    *,
    prompts: int,
    depths: Sequence[float],
    min_tokens: int,
    seed: int = 0,
    digits: int = 5,
) -> list[PasskeyPrompt]:
    """``prompts`` prompts per depth, each at least ``min_tokens`` tokens, all from ``seed``.

    Prompt ``i`` at depth ``d`` draws its pass key and its filler from the generator
    seeded with ``(seed, round(1000·d), i)``, so a prompt does not change when other
    depths or more prompts are asked for.
    """
    if prompts < 1:
        raise ValueError(f"prompts = {prompts}: must be >= 1")
    if not 1 <= digits <= 18:
        raise ValueError(f"digits = {digits}: must be within 1 … 18")
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"depth {d}: must be within [0, 1]")
    lengths = [len(tok.encode(" " + s)) for s in FILLER]
    fixed = len(tok.encode(INTRO + NEEDLE.format(key="9" * digits) + QUESTION))
    out = []
    for d in depths:
        for i in range(prompts):
            rng = np.random.default_rng([seed, round(1000 * d), i])
            key = str(int(rng.integers(10 ** (digits - 1), 10**digits)))
            sentences: list[str] = []
            n = fixed
            while True:
                while n < min_tokens:
                    j = int(rng.integers(len(FILLER)))
                    sentences.append(FILLER[j])
                    n += lengths[j]
                text, before = _text(sentences, d, key)
                ids = tok.encode(text)
                if len(ids) >= min_tokens:  # BPE merges across sentences: check the real count
                    break
                n = len(ids)
            out.append(PasskeyPrompt(i, d, key, ids, len(tok.encode(before.rstrip()))))
    return out


def score(answer: str, passkey: str) -> bool:
    """Exact match: the first run of digits in the answer is the pass key."""
    m = _DIGITS.search(answer)
    return m is not None and m.group() == passkey


def budget_tokens(fraction: float, prompt_tokens: int, total_tokens: int, block_tokens: int) -> int:
    """Tokens per KV head: whole blocks, ``fraction`` of the prompt's blocks (at least one).

    A fraction of 1.0 keeps every block of the prompt and the answer: the bounded path
    with nothing evicted, which must equal the full cache token for token.
    """
    if fraction >= 1.0:
        return -(-total_tokens // block_tokens) * block_tokens
    blocks = max(1, math.floor(fraction * -(-prompt_tokens // block_tokens)))
    return blocks * block_tokens


def decode(
    model: Any,
    cache: Any,
    prompt: Sequence[int],
    steps: int,
    *,
    bounded: BoundedCache | None = None,
    block_tokens: int = 16,
    aggregation: str = "max",
) -> list[int]:
    """Greedy answer of ``steps`` tokens decoded from the last prompt position on.

    ``cache`` holds the full prefill's keys and values; the last prompt position and every
    answer position are (re)computed here, with ``bounded``'s resident blocks visible
    (and its policy told each position's reads) or, without it, the full cache.
    """
    P = len(prompt)
    cache.length = P - 1
    nxt, out = int(prompt[-1]), []
    for q in range(P - 1, P - 1 + steps):
        visible = None
        if bounded is not None:
            visible = bounded.open_block(q) if q % block_tokens == 0 else bounded.visible()
        lg, att = model.forward(
            [nxt], cache, visible=visible, block_tokens=block_tokens, capture=aggregation
        )
        if bounded is not None:
            bounded.observe(q, att)
        nxt = int(np.argmax(lg[-1]))
        out.append(nxt)
    return out


def bounded_answer(
    model: Any,
    cap: Any,
    spec: PolicySpec,
    budget: int,
    *,
    config: Any,
    answer_tokens: int,
) -> tuple[list[int], dict[str, Any]]:
    """The answer under ``spec``'s cache of ``budget`` tokens per KV head, after the policy
    observed the prefill (positions 0 … P−2); and the cache's counters."""
    P, bt = cap.prompt_tokens, cap.block_tokens
    n_blocks = -(-(P + answer_tokens) // bt)
    bc = BoundedCache(spec, budget, model.cfg, n_blocks, block_tokens=bt, config=config)
    for p0 in range(0, P - 1, bt):
        bc.open_block(p0)
        bc.observe(p0, cap.weights[p0 : min(p0 + bt, P - 1)])
    ids = decode(
        model,
        cap.cache,
        cap.tokens[:P],
        answer_tokens,
        bounded=bc,
        block_tokens=bt,
        aggregation=bc.config.aggregation,
    )
    audit = bc.finish()
    stats = bc.fw.cache.stats.as_dict()
    return ids, {"evictions": stats["evictions"], "audited_victims": audit.checked}


def run_prompt(
    model: Any,
    tok: Any,
    prompt: PasskeyPrompt,
    specs: Sequence[PolicySpec],
    fractions: Sequence[float],
    *,
    config: Any,
    block_tokens: int = 16,
    answer_tokens: int = 8,
    read_threshold: float = 0.01,
    tick: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One prompt: prefill once, the full-cache answer, then every policy × budget."""
    agg = config.aggregation
    cap = capture(
        model,
        prompt.tokens,
        answer_tokens,
        block_tokens=block_tokens,
        aggregation=agg,
        chunk=128,
        keep_cache=True,
    )
    P = cap.prompt_tokens
    full = decode(
        model, cap.cache, prompt.tokens, answer_tokens, block_tokens=block_tokens, aggregation=agg
    )
    full_text = tok.decode(full)
    row: dict[str, Any] = {
        "index": prompt.index,
        "depth": prompt.depth,
        "measured_depth": round(prompt.measured_depth, 4),
        "passkey": prompt.passkey,
        "prompt_tokens": P,
        "prefill_seconds": cap.info["prefill_seconds"],
        "full": {"answer": full_text, "correct": score(full_text, prompt.passkey)},
        "capture_agrees": full == cap.tokens[P:],  # one chunked prefill vs. one row at a time
        "runs": [],
    }
    for spec in specs:
        for f in fractions:
            budget = budget_tokens(f, P, P + answer_tokens, block_tokens)
            ids, counters = bounded_answer(
                model, cap, spec, budget, config=config, answer_tokens=answer_tokens
            )
            text = tok.decode(ids)
            hit = replay_hit_rate(
                cap.weights,
                spec.name,
                config.with_(**budget_overrides(spec, budget)),
                budget,
                block_tokens,
                read_threshold,
                audit=False,  # the bounded run above audits this policy's victims
            )
            row["runs"].append(
                {
                    "policy": spec.label,
                    "budget": f,
                    "budget_tokens": budget,
                    "answer": text,
                    "correct": score(text, prompt.passkey),
                    "same_as_full": ids == full,
                    **counters,
                    "hit_rate": round(hit["hit_rate"], 6),
                    "mass_hit_rate": round(hit["mass_hit_rate"], 6),
                }
            )
            if tick:
                tick()
    cap.cache = None  # the keys and values are large; the row is what is kept
    return row


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy (Wilson 95 % CI) and hit rate (mean, Student-t 95 % CI) per policy × budget ×
    depth over the prompts; the full cache is the policy ``full`` at budget 1.0."""
    groups: dict[tuple[str, float, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(("full", 1.0, r["depth"]), []).append(r["full"])
        for run in r["runs"]:
            groups.setdefault((run["policy"], run["budget"], r["depth"]), []).append(run)
    out = []
    for (policy, budget, depth), runs in groups.items():
        acc = wilson_ci(sum(bool(x["correct"]) for x in runs), len(runs))
        entry: dict[str, Any] = {
            "policy": policy,
            "budget": budget,
            "depth": depth,
            "accuracy": acc["rate"],
            "accuracy_lo": acc["lo"],
            "accuracy_hi": acc["hi"],
            "prompts": acc["n"],
        }
        if policy != "full":
            hr = mean_ci([x["hit_rate"] for x in runs])
            entry["hit_rate"] = hr["mean"]
            entry["hit_rate_ci95"] = hr["ci95"]
            entry["same_as_full"] = float(np.mean([x["same_as_full"] for x in runs]))
            entry["budget_tokens"] = float(np.mean([x["budget_tokens"] for x in runs]))
        out.append(entry)
    return out


def plot(summary: Sequence[dict[str, Any]], path: Any) -> None:
    """A PNG at ``path``: accuracy (with its CI) and hit rate vs. budget, one
    panel per depth, one line per policy; the full cache as a dashed level."""
    depths = sorted({s["depth"] for s in summary})
    shape = {"nrows": 2, "ncols": len(depths), "figsize": (4 * len(depths), 6.5), "squeeze": False}
    with figure(path, dpi=110, tight=True, **shape) as (fig, axes):
        _draw(summary, depths, fig, axes)


def _draw(summary: Sequence[dict[str, Any]], depths: list[Any], fig: Any, axes: Any) -> None:
    policies = list(dict.fromkeys(s["policy"] for s in summary if s["policy"] != "full"))
    markers = "osD^v<>"
    for j, d in enumerate(depths):
        at = [s for s in summary if s["depth"] == d]
        full = next((s for s in at if s["policy"] == "full"), None)
        a_acc, a_hit = axes[0][j], axes[1][j]
        for k, pol in enumerate(policies):
            pts = sorted((s for s in at if s["policy"] == pol), key=lambda s: s["budget"])
            xs = [100 * s["budget"] for s in pts]
            acc = np.array([s["accuracy"] for s in pts]) * 100
            err = [
                acc - [100 * s["accuracy_lo"] for s in pts],
                [100 * s["accuracy_hi"] for s in pts] - acc,
            ]
            m = markers[k % len(markers)]
            a_acc.errorbar(xs, acc, yerr=err, marker=m, capsize=3, label=pol)
            a_hit.plot(xs, [s["hit_rate"] for s in pts], marker=m, label=pol)
        if full is not None:
            a_acc.axhline(100 * full["accuracy"], color="k", ls="--", lw=1, label="full cache")
        n = full["prompts"] if full else at[0]["prompts"]
        a_acc.set(title=f"needle at depth {d:g} ({n} prompts)", ylim=(-5, 105))
        a_acc.set(xlabel="budget (% of the prompt's KV)", ylabel="accuracy (%), Measured")
        a_hit.set(xlabel="budget (% of the prompt's KV)", ylabel="hit rate, Simulated")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M passkey retrieval under bounded KV caches")
