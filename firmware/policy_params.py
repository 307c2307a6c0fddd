"""The baselines' own parameters: each is used by the policies that list it in their
``parameters`` (``Policy.parameters``), and only carried by the configuration.

The ones here are shared by several policies or were declared before a policy could
declare its own; a new policy declares its Params in its own file, in its ``parameters``
(``register`` passes them to :func:`declare`).  :func:`table` is every one of them, and
``POLICY_PARAMS`` that table as read.
A policy reads its values as ``self.params.NAME``; `kvcxl policy params` lists
which policies use each.
"""

from __future__ import annotations

from typing import Any

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

DECLARED: dict[str, Param] = {
    "sink_tokens": SINK_TOKENS,
    "recent_tokens": RECENT_TOKENS,
    "lrfu_lambda": LRFU_LAMBDA,
    "lfu_tie_break": LFU_TIE_BREAK,
    "seed": SEED,
}


_REGISTERED: dict[str, tuple[str, Param]] = {}  # name → (first policy declaring it, Param)


def declare(policy: str, params: dict[str, Param]) -> None:
    """Record the parameters policy ``policy`` declares (its class's ``parameters``; called by
    ``register``).  One name, one Param: a second, different Param of a name is refused,
    naming both declarations."""
    for key, param in params.items():
        first = ("policy_params.py", DECLARED[key]) if key in DECLARED else _REGISTERED.get(key)
        if first is not None and first[1] is not param:
            raise ValueError(
                f"policy parameter {key!r} is declared twice ({first[0]} and {policy}): "
                "share one Param"
            )
        _REGISTERED.setdefault(key, (policy, param))


def table() -> dict[str, Param]:
    """Every policy's own parameter: those declared here, then those the registered
    policies declare in their own files (in registry order).  A policy's parameters are
    known once its module is imported: ``import kvcxl.firmware.policies`` imports them
    all, as every driver does (the policies import the configuration, which cannot
    import them)."""
    return {**DECLARED, **{k: p for k, (_, p) in _REGISTERED.items() if k not in DECLARED}}


def __getattr__(name: str) -> Any:
    """``POLICY_PARAMS``: :func:`table`, computed when read (after the policies registered)."""
    if name == "POLICY_PARAMS":
        return table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
