"""The fast engine reads as named phases: no function in emu/sim/fast/ over 150 lines or 10
parameters (the replay loop was one 584-line function with helpers of 19-29 parameters)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvcxl.emu.sim.fast as fast

MAX_LINES = 150
MAX_PARAMS = 10


def _too_big(root: Path) -> list[str]:
    """Every function (methods and nested ones included) under ``root`` over either limit,
    as "file:line name: N lines, M parameters"."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            params += (a.vararg is not None) + (a.kwarg is not None)
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > MAX_LINES or params > MAX_PARAMS:
                rel = path.relative_to(root)
                out.append(f"{rel}:{node.lineno} {node.name}: {lines} lines, {params} parameters")
    return out


def test_no_fast_engine_function_over_the_limits() -> None:
    root = Path(fast.__file__).resolve().parent
    assert _too_big(root) == []


def test_the_check_sees_a_long_function_and_a_long_signature(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    args = ", ".join(f"a{i}" for i in range(MAX_PARAMS))
    (tmp_path / "wide.py").write_text(f"def wide({args}, *rest):\n    pass\n")
    (tmp_path / "fine.py").write_text(f"def fine({args}):\n    pass\n")
    found = _too_big(tmp_path)
    assert [f.split(" ")[1].rstrip(":") for f in found] == ["long", "wide"], found
