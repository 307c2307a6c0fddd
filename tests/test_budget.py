"""The one budget grammar (kvcxl.common.sizes.Budget) and every ``--budget`` option using it.

The cases are written from the grammar's docstring, not from the code: an amount in the unit,
a percentage of the total the command names (bytes round down, tokens round up to at least
one, a fraction's total is 1), ``all`` (the whole total), and what is refused.
"""

from __future__ import annotations

import argparse
import ast
import pickle
from pathlib import Path

import pytest

from kvcxl.cli import main as cli
from kvcxl.common.sizes import BYTES, FRACTION, TOKENS, Budget, BudgetArg, budget_arg

PACKAGE = Path(__file__).resolve().parents[1]

# (text, unit, total, amount): the amount resolve(total) gives.
GOOD = [
    ("512MiB", BYTES, None, 512 * 2**20),
    ("2GB", BYTES, None, 2 * 10**9),
    ("4096", BYTES, None, 4096),
    ("0x1000", BYTES, None, 4096),
    ("0", BYTES, 1000, 0),  # bytes allow 0
    ("25%", BYTES, 1000, 250),
    ("25%", BYTES, 1001, 250),  # bytes round down
    ("0%", BYTES, 1000, 0),
    ("100%", BYTES, 1000, 1000),
    ("all", BYTES, 1000, 1000),
    ("ALL", BYTES, 1000, 1000),
    ("128", TOKENS, None, 128),
    ("1", TOKENS, None, 1),
    ("25%", TOKENS, 400, 100),
    ("25%", TOKENS, 401, 101),  # tokens round up
    ("1%", TOKENS, 10, 1),  # ... to at least one token
    ("all", TOKENS, 77, 77),
    ("0.25", FRACTION, None, 0.25),
    ("1", FRACTION, None, 1.0),
    ("25%", FRACTION, None, 0.25),  # a fraction's total is 1, whatever is passed
    ("25%", FRACTION, 400, 0.25),
    ("all", FRACTION, None, 1.0),
]

# (text, unit, words the refusal must name): the bad value, and what is accepted.
BAD = [
    ("150%", BYTES, ["'150%'", "[0, 100]"]),
    ("-1%", BYTES, ["'-1%'", "[0, 100]"]),
    ("abc", BYTES, ["'abc'", "use bytes"]),
    ("12 parsecs", BYTES, ["'12 parsecs'"]),
    ("x%", BYTES, ["'x%'", "not a number"]),
    ("0", TOKENS, ["'0'", ">= 1"]),
    ("150%", TOKENS, ["'150%'", "(0, 100]"]),
    ("0%", TOKENS, ["'0%'", "(0, 100]"]),
    ("1.5", TOKENS, ["'1.5'", "accepted"]),
    ("abc", TOKENS, ["'abc'", "accepted"]),
    ("0", FRACTION, ["'0'", "(0, 1]"]),
    ("1.5", FRACTION, ["'1.5'", "(0, 1]"]),
    ("nan", FRACTION, ["'nan'", "(0, 1]"]),
    ("150%", FRACTION, ["'150%'", "(0, 100]"]),
    ("abc", FRACTION, ["'abc'", "accepted"]),
]


@pytest.mark.parametrize(("text", "unit", "total", "amount"), GOOD)
def test_a_budget_resolves_to_its_amount(text, unit, total, amount) -> None:
    b = Budget.parse(text, unit)
    got = b.resolve(total)
    assert got == amount and type(got) is type(amount), (text, unit.name, total, got)
    assert str(b) == text and f"{b:>8}" == f"{text:>8}"  # reports print it as written
    assert b.relative == (text.endswith("%") or text.lower() == "all")


@pytest.mark.parametrize(("text", "unit", "names"), BAD)
def test_a_bad_budget_is_refused_naming_it(text, unit, names) -> None:
    with pytest.raises(ValueError) as exc:
        Budget.parse(text, unit)
    for n in names:
        assert n in str(exc.value), f"{n!r} not in: {exc.value}"
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{text}'"):
        budget_arg(unit)(text)


@pytest.mark.parametrize("text", ["25%", "all"])
def test_a_share_without_a_total_is_refused(text) -> None:
    for unit in (BYTES, TOKENS):
        with pytest.raises(ValueError, match=f"'{text}'.*relative"):
            Budget.parse(text, unit).resolve()


def test_a_budget_pickles_and_compares_by_value() -> None:
    """Sweeps send budgets to worker processes; a copy must behave as the original."""
    for text, unit, total, amount in GOOD:
        b = pickle.loads(pickle.dumps(Budget.parse(text, unit)))
        assert b == Budget.parse(text, unit) and b.resolve(total) == amount


def test_a_sweep_carries_budgets_parsed_and_writes_their_text() -> None:
    from kvcxl.emu.sim.sweep import SweepSpec

    spec = SweepSpec(budgets=["10%", Budget.parse("64KiB", BYTES)])
    assert spec.budgets == [Budget.parse("10%", BYTES), Budget.parse("64KiB", BYTES)]
    assert spec.to_dict()["budgets"] == ["10%", "64KiB"]  # results.json's config
    again = SweepSpec(**pickle.loads(pickle.dumps(spec._task())))  # a worker's copy
    assert again.budgets == spec.budgets
    with pytest.raises(ValueError, match="'150%'"):
        SweepSpec(budgets=["150%"])


# --- every --budget option is a Budget, parsed by argparse ----------------------------------
def _options(parser: argparse.ArgumentParser, path: str = "kvcxl"):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, p in a.choices.items():
                yield from _options(p, f"{path} {name}")
        else:
            yield path, a


def test_every_budget_option_of_the_command_line_is_a_budget() -> None:
    found = [
        (path, a) for path, a in _options(cli.build_parser()) if "--budget" in a.option_strings
    ]
    assert len(found) >= 5, found  # simulate, rtl sim, qemu boot, quality, calibrate
    wrong = [path for path, a in found if not isinstance(a.type, BudgetArg)]
    assert not wrong, f"--budget without type=budget_arg(UNIT): {wrong}"
    # a default given as text is parsed too (argparse runs it through the type)
    for path, a in found:
        assert a.default is None or isinstance(a.type(a.default), Budget), path


def _budget_calls(tree: ast.AST):
    """Every call whose first argument is the literal "--budget" (add_argument, or a row of
    an option table), with its keyword names and values."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and first.value == "--budget":
                yield node, {k.arg: k.value for k in node.keywords}


def test_every_budget_option_in_the_source_has_the_budget_type() -> None:
    """A --budget in any module (also parsers outside `kvcxl`, e.g. python -m ... modes)."""
    missing, seen = [], 0
    for path in PACKAGE.glob("*/**/*.py"):
        if path.parts[len(PACKAGE.parts)] in ("tests", "build", ".venv", "out"):
            continue
        for node, kw in _budget_calls(ast.parse(path.read_text(), str(path))):
            seen += 1
            t = kw.get("type")
            ok = (
                isinstance(t, ast.Call)
                and isinstance(t.func, ast.Name)
                and t.func.id == "budget_arg"
            )
            if not ok:
                missing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert seen >= 6, seen
    assert not missing, f"--budget without type=budget_arg(UNIT): {missing}"
