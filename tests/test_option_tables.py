"""Command modules list their options as tables (kvcxl.common.options), so that each
``register`` stays short: a new option is a row, not more argparse calls."""

from __future__ import annotations

import argparse
import ast
import importlib

import pytest

from kvcxl.cli import main as cli
from kvcxl.common.options import Group, add_options, add_parser, opt

MOST_LINES = 80


@pytest.mark.parametrize("name", cli.COMMAND_MODULES)
def test_every_register_is_short(name: str) -> None:
    path = importlib.import_module(name).__file__
    tree = ast.parse(open(path).read())
    long = [
        f"{n.name}: {n.end_lineno - n.lineno + 1} lines"
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
        and n.name == "register"
        and n.end_lineno - n.lineno + 1 > MOST_LINES
    ]
    assert not long, f"{name}: put the options in a table (kvcxl.common.options): {long}"


def test_a_table_adds_its_rows_groups_and_exclusive_groups_in_order() -> None:
    rows = (
        Group(None, (opt("--a"), opt("--b")), exclusive=True, required=True),
        opt("--n", type=int, default=3, help="a number"),
        Group("more", (opt("--c", action="store_true"),)),
    )
    parser = argparse.ArgumentParser(prog="t")
    sub = parser.add_subparsers(dest="cmd")
    p = add_parser(sub, "x", rows, func=lambda a: 0, help="the x command")
    add_options(p, (opt("--d"),))
    assert [a.dest for a in p._actions] == ["help", "a", "b", "n", "c", "d"]
    args = parser.parse_args(["x", "--a", "1"])
    assert (args.a, args.n, args.c, args.func(args)) == ("1", 3, False, 0)
    with pytest.raises(SystemExit):  # one of --a / --b is required, not both
        parser.parse_args(["x", "--a", "1", "--b", "2"])
    assert [g.title for g in p._action_groups][-1] == "more"
