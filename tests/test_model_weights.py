"""The model file's installation checks (no model run)."""

from __future__ import annotations

import pytest

from kvcxl.model import weights


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
    from kvcxl.cli.main import main
    from kvcxl.model import capture

    monkeypatch.setattr(capture, "_SHARED", {})  # no model loaded earlier in this process
    monkeypatch.setattr(weights, "locate", lambda: None)
    rc = main(["trace", "capture", "--prompt", "chat", "-o", str(tmp_path / "t.npz")])
    assert rc == 1  # not bad input: the machine lacks the model (kvcxl.common.errors.Failure)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed" in err[0]


class _Tok:
    """A stand-in tokenizer: one id per character (prompt loading needs only encode)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_prompt_files_text_json_and_errors(tmp_path) -> None:
    from kvcxl.model.capture import load_prompt, load_token_file

    txt = tmp_path / "p.txt"
    txt.write_text("hi")
    assert load_prompt(txt, _Tok()) == [104, 105]
    chat = tmp_path / "c.json"
    chat.write_text('{"messages": [{"role": "user", "content": "x"}]}')
    text = "".join(map(chr, load_prompt(chat, _Tok())))
    assert text.endswith("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system message
    bad = tmp_path / "b.json"
    bad.write_text('{"msgs": []}')
    with pytest.raises(ValueError, match="must be"):
        load_prompt(bad, _Tok())
    with pytest.raises(FileNotFoundError, match="committed prompts: "):
        load_prompt(tmp_path / "none.json", _Tok())
    ids = tmp_path / "ids.txt"
    ids.write_text("[1, 2,3]")
    assert load_token_file(ids, 10) == [1, 2, 3]
    ids.write_text("1 x")
    with pytest.raises(ValueError, match="not a token id"):
        load_token_file(ids, 10)
