"""``kvcxl setup``: install and warm what the slow tests need beyond pip.

Each part contributes a step (a function taking ``force: bool``) by listing it in
SETUP_STEPS.  Steps are idempotent.
"""

from __future__ import annotations

import argparse
import importlib

SETUP_STEPS: tuple[tuple[str, str, str], ...] = (
    # (name, module, function)
    ("engine", "kvcxl.emu.sim.fast.warm", "setup"),
    ("rtl", "kvcxl.rtl.toolchain", "setup"),
    ("qemu", "kvcxl.qemu.setup", "setup"),
    ("model", "kvcxl.model.weights", "setup"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "setup",
        help="install and warm what the slow tests use (Debian packages, guest kernel, caches)",
        description="Idempotent set-up of the HDL toolchain cache, the QEMU host and the model.",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=[s[0] for s in SETUP_STEPS],
        help="run only this step (repeatable)",
    )
    p.add_argument("--force", action="store_true", help="redo steps that are already done")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    for name, module, func in SETUP_STEPS:
        if args.only and name not in args.only:
            continue
        mod = importlib.import_module(module)
        print(f"setup {name}: ...", flush=True)
        getattr(mod, func)(force=args.force)
        print(f"setup {name}: done", flush=True)
    return 0
