"""The baselines' own parameters: each is used by the policies that list it in their
``parameters`` (``Policy.parameters``), and only carried by the configuration.

They are declared here, beside the engine's table (:mod:`kvcxl.firmware.config`)
rather than inside the policy modules, so that the configuration can check a name
and a value without importing the policies (which import the configuration).
A policy reads its values as ``self.params.NAME``; `kvcxl policy params` lists
which policies use each.
"""

from __future__ import annotations

from .params import REAL, Param, in_range, one_of

SINK_TOKENS = Param(
    "[0, 1048576] tokens",
    in_range(0, 1 << 20),
    int,
    "The first S tokens of each context (the attention sink) are never evicted.",
    default=4,
)
RECENT_TOKENS = Param(
    "[0, 1048576] tokens",
    in_range(0, 1 << 20),
    int,
    "The most recent tokens of each context are never evicted; the rest compete on "
    "accumulated attention.",
    default=128,
)
LRFU_LAMBDA = Param(
    "[0, 1]",
    in_range(0.0, 1.0),
    REAL,
    "CRF weight (1/2)^(λ·age) of a past reference: 0 is LFU, 1 is LRU-like.",
    default=0.1,
)
LFU_TIE_BREAK = Param(
    "'lru' or 'index'",
    one_of("lru", "index"),
    str,
    "Order among equal counts: 'lru' the least recently read first (libCacheSim's LFU); "
    "'index' the lower entry id first.",
    default="lru",
)
SEED = Param(
    "[0, 2**63)",
    in_range(0, 2**63 - 1),
    int,
    "Seed of the random victims (option --policy-seed; --seed is the workload's).",
    default=0,
)

POLICY_PARAMS: dict[str, Param] = {
    "sink_tokens": SINK_TOKENS,
    "recent_tokens": RECENT_TOKENS,
    "lrfu_lambda": LRFU_LAMBDA,
    "lfu_tie_break": LFU_TIE_BREAK,
    "seed": SEED,
}


def declare(params: dict[str, Param]) -> dict[str, Param]:
    """Add a policy module's own parameters (declared in that module) to the table, once
    each; returns them for the policy's ``parameters``."""
    for name, param in params.items():
        if POLICY_PARAMS.get(name, param) is not param:
            raise ValueError(f"policy parameter {name!r} declared twice")
        POLICY_PARAMS[name] = param
    return params
