"""The bottom layer's output helpers: the progress bar stays off off a terminal, the JSON
writer keeps stdout clean, the figure set-up writes a PNG and closes the figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvcxl.common.figures import figure
from kvcxl.common.jsonout import write_json
from kvcxl.common.progress import progress


def test_progress_is_off_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    bar, update = progress(100, "test", "item")
    update(3)
    assert bar.disable
    bar.close()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar, _ = progress(100, "test", "item")
    assert not bar.disable  # the same call on a terminal draws
    assert (bar.desc, bar.unit) == ("test", "item")
    bar.close()


def test_write_json_note_on_stderr_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = {"a": [1, 2.5, None], "b": {"c": "d"}}
    path = tmp_path / "out.json"
    write_json(path, doc)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"wrote {path}\n"
    assert json.loads(path.read_text()) == doc


def test_figure_writes_png_and_closes(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    path = tmp_path / "f.png"
    with figure(path, tight=True, figsize=(2, 2)) as (fig, ax):
        ax.plot([0, 1], [1, 0])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)
