"""Capture, bounded-cache quality and calibration on the real model (short sequences for CI)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcxl.common.sizes import TOKENS, Budget
from kvcxl.model.quality import PolicySpec

pytestmark = [pytest.mark.slow, pytest.mark.model]

PROMPT_TOKENS = 120  # each committed prompt cut here, + 8 generated: 8 blocks of 16
STEPS = 8


@pytest.fixture(scope="module")
def model():
    from kvcxl.model.capture import shared_model

    return shared_model(1)


@pytest.fixture(scope="module")
def captures(model):
    from kvcxl.model.capture import capture, load_prompt, prompt_files

    m, tok = model
    out = {}
    for name in prompt_files():
        ids = load_prompt(name, tok)[:PROMPT_TOKENS]
        out[name] = capture(m, ids, STEPS)
    return out


@pytest.fixture(scope="module")
def references(model, captures):
    from kvcxl.model.quality import run

    m, _ = model
    return {n: run(m, c.tokens, policy=None, budget_tokens=None)[0] for n, c in captures.items()}


def test_committed_prompts_present() -> None:
    from kvcxl.model.capture import prompt_files

    assert {"chat", "long-doc", "code"} <= set(prompt_files())


def test_captured_trace_passes_validation(captures, tmp_path) -> None:
    from kvcxl.emu.trace import Trace
    from kvcxl.model.capture import to_trace
    from kvcxl.model.weights import GGUF_SHA256

    cap = captures["chat"]
    path = to_trace(cap, source="test").save(tmp_path / "t.npz")
    t = Trace.load(path)
    assert t.evidence == "Measured"
    assert t.extra["model"] == "smollm2-135m" and t.extra["model_sha256"] == GGUF_SHA256
    assert t.extra["tokens"] == cap.tokens and t.extra["prompt_tokens"] == PROMPT_TOKENS
    n = len(cap.tokens)
    assert t.n_steps == n
    # Every position reads every block so far, in every layer and KV head.
    assert len(t) == sum(30 * 3 * (s // 16 + 1) for s in range(n))
    per = np.zeros((n, 30, 3))
    np.add.at(per, (t.step, t.layer, t.head), t.weight)
    assert per.min() >= 1 - 1e-4  # max over 3 query heads of weights summing to 1
    assert per.max() <= 3 + 1e-4
    dec = to_trace(cap, source="test", decode_only=True)
    assert int(dec.step.min()) == PROMPT_TOKENS - 1 and dec.n_steps == STEPS + 1


def test_capture_cli_writes_a_valid_trace(tmp_path, model) -> None:
    from kvcxl.cli.main import main
    from kvcxl.emu.trace import Trace

    toks = tmp_path / "ids.txt"
    toks.write_text("1 9690 198 2683 359 253 5356, 5646 11173")
    out, js = tmp_path / "c.npz", tmp_path / "c.json"
    rc = main(["trace", "capture", "--tokens", str(toks), "--steps", "3", "-o", str(out),
               "--json", str(js), "--block-tokens", "4"])  # fmt: skip
    assert rc == 0
    t = Trace.load(out)
    assert t.shape.block_tokens == 4 and t.n_steps == 12
    assert json.loads(js.read_text())["generated_tokens"] == 3


def test_capture_cli_errors(tmp_path, capsys) -> None:
    from kvcxl.cli.main import main

    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 99999999")
    assert main(["trace", "capture", "--tokens", str(bad), "-o", str(tmp_path / "x.npz")]) == 2
    assert "out of range" in capsys.readouterr().err
    missing = str(tmp_path / "nope.json")
    assert main(["trace", "capture", "--prompt", missing, "-o", str(tmp_path / "x.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unbounded_budget_is_exact(model, captures, references) -> None:
    from kvcxl.model.quality import run

    m, _ = model
    cap = captures["long-doc"]
    for name in ("sink-window", "ema"):
        _, r = run(m, cap.tokens, policy=PolicySpec.parse(name),
                   budget_tokens=len(cap.tokens), reference=references["long-doc"])  # fmt: skip
        assert r.kl.max() == 0.0 and r.agree.all(), name
        assert not r.bounded.any() and r.cache["evictions"] == 0


def test_sink_window_monotone_in_budget_and_sink_effect(model, captures, references) -> None:
    """Smaller budget never gives better top-1 (sink-window); dropping the sink hurts."""
    from kvcxl.model.quality import evaluate

    m, _ = model
    for name, cap in captures.items():
        _, res = evaluate(
            m, cap.tokens, [PolicySpec.parse("sink-window")], [32, 64, 96],
            reference=references[name],
        )  # fmt: skip
        res += evaluate(m, cap.tokens, [PolicySpec.parse("window")], [64],
                        reference=references[name])[1]  # fmt: skip
        by = {(r.label, r.budget_tokens): r for r in res}
        top1 = [by[("sink-window", b)].agree.mean() for b in (32, 64, 96)]
        assert top1[0] <= top1[1] <= top1[2], (name, top1)
        for b in (64,):
            sw, w = by[("sink-window", b)], by[("window", b)]
            assert sw.audit["wrong_victims"] == 0 and sw.audit["audited_victims"] > 0
            assert sw.kl[sw.bounded].mean() < 0.5 * w.kl[w.bounded].mean(), (name, b)
            # The cache really was bounded from the first position past the budget on.
            assert not sw.bounded[:b].any() and sw.bounded[b + 16 :].all()


def test_policy_spec_and_budget_parsing() -> None:
    s = PolicySpec.parse("ema:alpha=0.05,beta=0.01,persistent_metadata=false")
    assert s.name == "ema" and s.overrides == {
        "alpha": 0.05, "beta": 0.01, "persistent_metadata": False,
    }  # fmt: skip
    assert PolicySpec.parse("window").overrides == {"sink_tokens": 0}
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        PolicySpec.parse("nope")
    with pytest.raises(ValueError, match="key=value"):
        PolicySpec.parse("ema:alpha")
    assert Budget.parse("25%", TOKENS).resolve(400) == 100
    assert Budget.parse("all", TOKENS).resolve(77) == 77
    with pytest.raises(ValueError, match="budget 'x'"):
        Budget.parse("x", TOKENS)


def test_quality_cli(tmp_path, captures, capsys) -> None:
    from kvcxl.cli.main import main
    from kvcxl.model.capture import to_trace

    path = to_trace(captures["code"], source="test").save(tmp_path / "code.npz")
    js = tmp_path / "q.json"
    rc = main(["quality", "--trace", str(path), "--policy", "sink-window", "--budget", "64",
               "--max-tokens", "96", "--json", str(js)])  # fmt: skip
    assert rc == 0
    out = json.loads(js.read_text())
    assert out["evidence"] == "Measured" and out["tokens"] == 96
    row = out["results"][0]
    assert row["policy"] == "sink-window" and len(row["per_step"]["kl"]) == 96
    assert len(row["per_step"]["top1_agree"]) == 96
    assert "sink-window" in capsys.readouterr().out
    # A trace without token ids (not a capture) is refused with a clear message.
    from kvcxl.emu.trace import Trace

    t = Trace.load(path)
    t.extra = {}
    t.save(tmp_path / "plain.npz")
    assert main(["quality", "--trace", str(tmp_path / "plain.npz")]) == 2
    assert "not a capture" in capsys.readouterr().err


def test_tiny_calibration_grid(tmp_path, captures) -> None:
    from kvcxl.cli.main import main
    from kvcxl.model.capture import to_trace

    path = to_trace(captures["chat"], source="test").save(tmp_path / "chat.npz")
    out = tmp_path / "cal"
    rc = main(["calibrate", "--trace", str(path), "--alpha", "0.05,0.2", "--beta", "0.001,0.1",
               "--budget", "64", "--max-tokens", "128", "--out", str(out)])  # fmt: skip
    assert rc == 0
    r = json.loads((out / "calibration.json").read_text())
    assert np.asarray(r["hit_rate"]).shape == (2, 2, 1)
    assert np.asarray(r["kl"]).shape == (2, 2, 1) and np.isfinite(r["kl"]).all()
    assert 0 < r["best_by_hit_rate"]["hit_rate"][0] <= 1
    assert r["seed_point"]["alpha"] == 0.05 and r["default_point"]["alpha"] == 0.2
    for png in ("hit_rate.png", "mass_hit_rate.png", "kl.png", "top1.png"):
        assert (out / png).stat().st_size > 1000
    keep = r["thresholds"]["per_trace"][0]["keep"]
    hot = [k["hot_set_fraction"] for k in keep]
    assert hot == sorted(hot, reverse=True)  # a higher keep threshold means a smaller hot set
    t = r["touch_threshold"]
    assert [row["touch_threshold"] for row in t["rows"]] == [0.001, 0.005, 0.01, 0.02, 0.05]
    assert t["best"] in [row["touch_threshold"] for row in t["rows"]]
    # At or below the read threshold (0.01) every read touches: the same replay.
    assert t["rows"][0]["hit_rate"] == t["rows"][2]["hit_rate"]
