"""Every utilisation the docs publish is at most 1 (a resource busy longer than the run is
a timing model that forgot a queue): the markdown tables' ``... use`` columns and the
``timeline utilisation`` blocks that ``kvcxl simulate --timeline`` prints, in README.md and
docs/*.md.  Link *demand* (bytes over what one direction carries, docs/serving.md) may
exceed 1 and is not read; where a column reads "demand before → use with", only the
part after the arrow is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_USE = re.compile(r"\b(use|utilisation)\b", re.IGNORECASE)
_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_BLOCK_HEAD = re.compile(r"^policy\s+budget\s+link rd\s+link wr\s+dram\s+nvme\b")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _after_arrow(text: str) -> str:
    return text.rsplit("→", 1)[1] if "→" in text else text


def utilisations(text: str) -> list[tuple[int, str, float]]:
    """(line number, column, value) of every utilisation in ``text``'s tables and
    timeline-utilisation blocks."""
    out: list[tuple[int, str, float]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            head = _cells(line)
            cols = [
                (k, h)
                for k, h in enumerate(head)
                if _USE.search(_after_arrow(h)) and "analytic" not in h.lower()
                and "demand" not in _after_arrow(h).lower()
            ]  # fmt: skip
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                row = _cells(lines[i])
                for k, h in cols:
                    if k < len(row):
                        cell = _after_arrow(row[k]) if "→" in h else row[k]
                        out += [(i + 1, h, float(v)) for v in _NUM.findall(cell)]
                i += 1
            continue
        if _BLOCK_HEAD.match(line.strip()):
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].startswith("```"):
                tok = lines[i].split()
                out += [(i + 1, "link rd / wr / dram / nvme", float(v)) for v in tok[2:6]]
                i += 1
            continue
        i += 1
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_published_utilisation_is_at_most_one(page: Path) -> None:
    over = [u for u in utilisations(page.read_text()) if u[2] > 1.0]
    assert not over, f"{page.name}: utilisation above 1 at {over}"


def test_the_pages_publish_utilisations() -> None:
    """The check reads something: the timeline, serving and validation pages' tables."""
    found = {p.name: len(utilisations(p.read_text())) for p in PAGES}
    assert found["timeline.md"] >= 10 and found["validation.md"] >= 100
    assert found["serving.md"] >= 8


def test_a_busy_resource_over_one_is_caught() -> None:
    table = (
        "| timing | link demand before → link use with | link rd / wr, DRAM, NVMe use |\n"
        "|---|---|---|\n"
        "| seed | 1.962 → 0.973 | 0.10 / 0.46 / 0.28 / 0.01 |\n"
    )
    assert [u[2] for u in utilisations(table)] == [0.973, 0.10, 0.46, 0.28, 0.01]
    assert max(u[2] for u in utilisations(table.replace("0.46", "1.02"))) == 1.02
    assert max(u[2] for u in utilisations(table.replace("→ 0.973", "→ 1.5"))) == 1.5
    block = (
        "policy          budget  link rd  link wr    dram    nvme  demand queue µs  analytic\n"
        "lru                25%    0.906    1.044   0.925   0.000             0.05   1.858\n"
    )
    assert [u[2] for u in utilisations(block)] == [0.906, 1.044, 0.925, 0.0]
