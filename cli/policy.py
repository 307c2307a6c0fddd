"""``kvcxl policy …``: inspect and check the policy configuration; compare policies."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcxl.common.jsonout import wrote


class AuditFailure(RuntimeError):
    """The eviction audit found a wrong victim (``kvcxl``: one line, exit status 1)."""

    exit_code = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "policy",
        help="policy parameters: list, check a TOML file, compare policies on a request stream",
        description="The policy engine's parameters (docs/policy.md) and a quick comparison.",
    )
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    pl = psub.add_parser(
        "list",
        help="every policy: what it evicts, its modes, and what the eviction audit checks of it",
        description=(
            "Every registered policy (firmware/policies/, one file each) with its summary, "
            "whether it is online, its arithmetic modes, and its audit: 'history' when the "
            "audit recomputes its priority from each entry's own history (the rule in the "
            "policy's file), or the policy's reason why not (then only the top-k part runs "
            "and reports print 'not audited')."
        ),
    )
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.set_defaults(func=_list)

    pp = psub.add_parser("params", help="list every parameter with default, range and effect")
    pp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pp.add_argument("--markdown", action="store_true", help="print the table in docs/policy.md")
    pp.set_defaults(func=_params)

    pc = psub.add_parser("check", help="validate a configuration TOML file")
    pc.add_argument("file", help="TOML file with parameters at top level or under [policy]")
    pc.set_defaults(func=_check)

    pw = psub.add_parser("write-default", help="write the default configuration as TOML")
    pw.add_argument("file")
    pw.set_defaults(func=_write_default)

    pm = psub.add_parser(
        "compare",
        help="every policy on a synthetic request stream at several capacities (audited)",
        description=(
            "Replays a seeded Zipf-like request stream through every policy (one HBM tier, "
            "demand paging, no prefetch) with the eviction audit on, and prints hit rates. "
            "A policy that cannot run at a capacity (e.g. S3-FIFO's small queue below one "
            "entry) is shown as 'not run' with the reason. Simulated."
        ),
    )
    pm.add_argument(
        "--requests", type=int, default=20000, help="requests to replay (default 20000)"
    )
    pm.add_argument("--objects", type=int, default=2000, help="distinct entries (default 2000)")
    pm.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    pm.add_argument("--seed", type=int, default=0)
    pm.add_argument("--config", help="policy configuration TOML")
    pm.add_argument("--json", dest="json_out", help="write results as JSON to this file")
    pm.set_defaults(func=_compare)


def policy_rows() -> list[dict[str, Any]]:
    """One row per registered policy, in the registry's order (docs/policy.md)."""
    from kvcxl.firmware.policies import POLICIES

    return [
        {
            "policy": name,
            "summary": cls.summary,
            "online": cls.online,
            "ablation": cls.ablation,
            "modes": list(cls.modes),
            "history_audit": cls.history is not None,
            "history_rule": cls.history.__name__ if cls.history else None,
            "not_audited": cls.not_audited or None,
        }
        for name, cls in POLICIES.items()
    ]


def _list(args: argparse.Namespace) -> int:
    rows = policy_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        kind = "online" if r["online"] else "offline"
        if r["ablation"]:
            kind += ", ablation"
        print(f"{r['policy']:<16} {r['summary']}  [{kind}; {'/'.join(r['modes'])}]")
        audit = (
            f"history ({r['history_rule']})"
            if r["history_audit"]
            else f"top-k only, not audited from history: {r['not_audited']}"
        )
        print(f"{'':<16} audit: {audit}")
    n = sum(r["history_audit"] for r in rows)
    print(f"\n{len(rows)} policies; the audit recomputes {n} from history (docs/policy.md).")
    return 0


def _all_params() -> list[tuple[str, str, Any, Any]]:
    """(name, owner, default, Param) of every parameter: the engine's, then each policy's own."""
    from kvcxl.firmware.config import PARAMS, PolicyConfig
    from kvcxl.firmware.policies import POLICIES
    from kvcxl.firmware.policy_params import POLICY_PARAMS

    default = PolicyConfig().to_dict()
    rows: list[tuple[str, str, Any, Any]] = [
        (k, "engine", default[k], p) for k, p in PARAMS.items()
    ]
    owners: dict[str, list[str]] = {}
    for name, cls in sorted(POLICIES.items()):
        for k in cls.parameters:
            owners.setdefault(k, []).append(name)
    for k, p in POLICY_PARAMS.items():
        rows.append(
            (
                k,
                ", ".join(owners[k]),
                list(p.default) if isinstance(p.default, tuple) else p.default,
                p,
            )
        )
    return rows


def _params(args: argparse.Namespace) -> int:
    rows = _all_params()
    if args.markdown:
        print(params_markdown())
        return 0
    if args.json:
        doc = {
            k: {"policies": owner, "default": d, "range": p.range_text, "doc": p.doc}
            for k, owner, d, p in rows
        }
        print(json.dumps(doc, indent=2))
        return 0
    for k, owner, d, p in rows:
        who = "" if owner == "engine" else f"  ({owner} only)"
        print(f"{k:<24} default {d!s:<20} range {p.range_text}{who}")
        print(f"{'':<24} {p.doc}\n")
    return 0


def params_markdown() -> str:
    """The parameter tables of docs/policy.md, generated from the configuration and the
    policies themselves."""
    rows = _all_params()
    out = [
        "| parameter | default | range | what it controls, which way it pushes |",
        "|---|---|---|---|",
    ]
    out += [f"| `{k}` | `{d}` | {p.range_text} | {p.doc} |" for k, o, d, p in rows if o == "engine"]
    out += [
        "",
        "Each baseline's own parameters (declared by its policy class as `parameters`; one "
        "option or key sets a name for every policy that declares it). Their defaults are "
        "inputs: the published algorithms' own (External literature, as libCacheSim "
        "implements them) or, for kvcxl's variants, Design target values:",
        "",
        "| parameter | policies | default | range | what it controls |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| `{k}` | {o} | `{d}` | {p.range_text} | {p.doc} |"
        for k, o, d, p in rows
        if o != "engine"
    ]
    return "\n".join(out)


def _check(args: argparse.Namespace) -> int:
    from kvcxl.firmware.config import PolicyConfig

    cfg = PolicyConfig.load(args.file)
    print(f"{args.file}: valid")
    default = PolicyConfig().effective()
    changed = {k: v for k, v in cfg.to_dict().items() if v != default[k]}
    for k, v in changed.items():
        print(f"  {k} = {v!r}")
    return 0


def _write_default(args: argparse.Namespace) -> int:
    from kvcxl.firmware.config import PolicyConfig

    PolicyConfig().save(args.file)
    wrote(args.file)
    return 0


def _compare(args: argparse.Namespace) -> int:
    import numpy as np

    from kvcxl.firmware.config import PolicyConfig
    from kvcxl.firmware.policies import POLICIES, CapacityTooSmall
    from kvcxl.firmware.replay import replay

    for flag, value in (("--requests", args.requests), ("--objects", args.objects)):
        if value < 1:
            raise ValueError(f"{flag} {value}: an integer >= 1 is accepted")
    if not args.zipf >= 0 or args.zipf == float("inf"):
        raise ValueError(f"--zipf {args.zipf}: a finite number >= 0 is accepted")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}: an integer >= 0 is accepted")
    cfg = PolicyConfig.load(args.config) if args.config else PolicyConfig()
    rng = np.random.default_rng(args.seed)
    ranks = np.arange(1, args.objects + 1, dtype=np.float64)
    prob = ranks**-args.zipf
    prob /= prob.sum()
    ids = rng.permutation(args.objects)[rng.choice(args.objects, size=args.requests, p=prob)]
    batches = [ids[i : i + 1] for i in range(ids.size)]
    weights = [np.array([prob[0] ** 0.5]) for _ in batches]
    caps = [max(1, int(args.objects * f)) for f in (0.02, 0.05, 0.10, 0.20)]
    results = []
    not_run = []  # (policy, capacity, reason): a policy that cannot run at a capacity
    print(
        f"{'policy':<16}"
        + "".join(f"{c:>10}" for c in caps)
        + "   (hit rate by capacity, Simulated)"
    )
    for name in sorted(POLICIES):
        row = []
        for cap in caps:
            try:
                r = replay(name, batches, cap, config=cfg, weights=weights)
            except CapacityTooSmall as e:
                # one policy's limit must not stop the comparison of the others
                not_run.append({"policy": name, "capacity": cap, "reason": str(e)})
                row.append(None)
                continue
            if r.audit and r.audit["wrong_victims"]:
                raise AuditFailure(f"eviction audit failed for {name}: {r.audit}")
            row.append(r.hit_rate)
            results.append(
                {
                    "policy": name,
                    "capacity": cap,
                    "hit_rate": r.hit_rate,
                    "hits": r.hits,
                    "misses": r.misses,
                    **r.audit,
                }
            )
        print(
            f"{name:<16}" + "".join(f"{'not run':>10}" if h is None else f"{h:>10.3f}" for h in row)
        )
    for n in not_run:
        print(f"not run: {n['policy']} at capacity {n['capacity']}: {n['reason']}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {
                    "evidence": "Simulated",
                    "config": cfg.to_dict(),
                    "results": results,
                    "not_run": not_run,
                },
                f,
                indent=2,
            )
        wrote(args.json_out)
    return 0
