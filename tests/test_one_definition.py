"""Every formula has one definition, and docs/architecture.md says truly where it is.

The policy's arithmetic is written once, as kernels in ``firmware/formulas.py`` (float) and
``firmware/fixedpoint.py`` (Q0.16); the firmware's array forms, the audit's history, the
fast engine (``emu/sim/fast/formulas.py`` compiles those same functions with numba) and the
RTL generator (which calls the Q0.16 kernels on Amaranth values) all call them.  This test
reads every source file of the project (tests excluded: they hold the second, plain
implementations that check these on purpose) and fails where a formula's arithmetic is
written out a second time, and where the architecture page's "Where each thing is
defined" table names a file and function that does not define it, or that another file
also defines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from parts import FOLDERS as PARTS  # setup.py's folders

ROOT = Path(__file__).resolve().parents[1]

SUFFIXES = (".py", ".c", ".cpp", ".h")

# formula → (its one file, patterns of its arithmetic written out)
FORMULAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "float EMA, (1 − α)·score": (
        "firmware/formulas.py",
        (r"\(\s*1(\.0)?\s*-\s*(alpha|a|cfg\.alpha|self\.config\.alpha)\s*\)",),
    ),
    "float priority, (1 − score)·r": (
        "firmware/formulas.py",
        (r"\(\s*1(\.0)?\s*-\s*(s|score|r\.score)\s*\)\s*\*",),
    ),
    "recency decay, 1 − e^(−β·idle)": ("firmware/formulas.py", (r"expm1\s*\(\s*-",)),
    "Q0.16 EMA, (65536 − α)·score": (
        "firmware/fixedpoint.py",
        (r"(Q_ONE|q_one|65536)\s*-\s*(alpha|alpha_q|a)\b",),
    ),
    "Q0.16 rounding, (x + 32768) >> 16": (
        "firmware/fixedpoint.py",
        (r"\+\s*(fx\.)?(HALF|32768)\s*\)\s*>>", r"\+\s*(fx\.)?HALF\s*\)\s*>>"),
    ),
    "Q0.16 priority, (65535 − score)·decay": (
        "firmware/fixedpoint.py",
        (r"\(\s*(Q_MAX|q_max|65535)\s*-\s*(s|score|r\.score)\s*\)\s*\*",),
    ),
}


def sources() -> list[Path]:
    out = []
    for part in PARTS:
        out += [p for p in (ROOT / part).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(out)


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines without comments and docstring-only lines (prose may name a formula)."""
    lines, in_doc = [], False
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        s = line.strip()
        if path.suffix == ".py":
            quotes = s.count('"""') + s.count("'''")
            if in_doc or s.startswith(('"""', "'''", 'r"""')):
                if quotes % 2 == 1:
                    in_doc = not in_doc
                continue
            line = line.split("#", 1)[0]
        else:
            line = line.split("//", 1)[0]
        lines.append((n, line))
    return lines


def writings(pattern: str, files: list[Path] | None = None, root: Path = ROOT) -> list[str]:
    """Every place (file:line) whose code matches ``pattern`` (in ``files``, else every source)."""
    rx = re.compile(pattern)
    return [
        f"{p.relative_to(root)}:{n}"
        for p in (sources() if files is None else files)
        for n, line in code_lines(p)
        if rx.search(line)
    ]


@pytest.mark.parametrize("formula", sorted(FORMULAS))
def test_a_formula_is_written_in_one_file(formula: str) -> None:
    home, patterns = FORMULAS[formula]
    found = sorted({w for p in patterns for w in writings(p)})
    assert found, f"{formula}: not found at all; the pattern no longer matches {home}"
    elsewhere = [w for w in found if not w.startswith(home + ":")]
    assert not elsewhere, f"{formula} written again outside {home}: {elsewhere}"


def test_a_planted_second_definition_is_found(tmp_path: Path) -> None:
    """The scan sees each formula written out again in another file (and not in prose)."""
    copies = {
        "float EMA, (1 − α)·score": "return a * w + (1.0 - a) * s",
        "float priority, (1 − score)·r": "p = (1.0 - score) * r",
        "recency decay, 1 − e^(−β·idle)": "r = -np.expm1(-beta * idle)",
        "Q0.16 EMA, (65536 − α)·score": "x = alpha * w + (Q_ONE - alpha) * s",
        "Q0.16 rounding, (x + 32768) >> 16": "y = (x + HALF) >> 16",
        "Q0.16 priority, (65535 − score)·decay": "p = (Q_MAX - score) * d",
    }
    assert set(copies) == set(FORMULAS)
    for formula, code in copies.items():
        planted = tmp_path / "copy.py"
        planted.write_text(f'"""{code}, in prose."""\n# {code}\ndef f():\n    {code}\n')
        found = {w for p in FORMULAS[formula][1] for w in writings(p, [planted], tmp_path)}
        assert found == {"copy.py:4"}, (formula, found)


FORMULA_FILES = ("firmware/formulas.py", "firmware/fixedpoint.py", "firmware/select.py",
                 "firmware/golden_step.py")  # fmt: skip
_ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*`([^`]+\.py)`\s*\(([^)]*)\)")


def architecture_rows() -> list[tuple[str, str, list[str]]]:
    """(what, file, functions) of the "Where each thing is defined" table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Where each thing is defined", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            names = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", m.group(3))
            if names:
                rows.append((m.group(1), m.group(2), names))
    return rows


def definers(name: str) -> list[str]:
    rx = re.compile(rf"^\s*(def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]")
    return sorted(
        str(p.relative_to(ROOT))
        for p in sources()
        if p.suffix == ".py" and any(rx.search(line) for _, line in code_lines(p))
    )


def test_the_architecture_table_is_true_by_grep() -> None:
    rows = architecture_rows()
    assert len(rows) >= 8, rows  # the table's formula rows were found
    for what, path, names in rows:
        for name in names:
            where = definers(name)
            assert path in where, f"{what}: `{name}` is not defined in {path} (but in {where})"
            if path in FORMULA_FILES:  # a formula's name defined twice is a second definition
                assert where == [path], f"{what}: `{name}` is also defined in {where}"
