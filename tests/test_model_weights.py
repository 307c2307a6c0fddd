"""The model file's installation checks (no model run)."""

from __future__ import annotations

import pytest
from kvcxl.emu.model import weights


def test_missing_file_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(weights, "locate", lambda: None)
    with pytest.raises(weights.ModelFileError, match="kvcxl setup --only model"):
        weights.gguf_path()


def test_altered_file_is_refused(monkeypatch, tmp_path) -> None:
    fake = tmp_path / weights.GGUF_NAME
    fake.write_bytes(b"GGUF not the pinned weights")
    monkeypatch.setattr(weights, "locate", lambda: fake)
    with pytest.raises(weights.ModelFileError, match="differs from the pinned"):
        weights.gguf_path(verify=True)
    assert weights.gguf_path(verify=False) == fake


def test_cli_reports_missing_model_in_one_line(monkeypatch, tmp_path, capsys) -> None:
    from kvcxl.emu.cli import main
    from kvcxl.emu.model import capture

    monkeypatch.setattr(capture, "_SHARED", {})  # no model loaded earlier in this process
    monkeypatch.setattr(weights, "locate", lambda: None)
    rc = main(["trace", "capture", "--prompt", "chat", "-o", str(tmp_path / "t.npz")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed" in err[0]
