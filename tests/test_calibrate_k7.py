"""`kvcxl calibrate` over every trace-fittable §K.7 parameter (model/calibrate_k7.py).

The α × β choice is checked on hit-rate grids whose answer is known; the command runs end
to end on a synthetic capture-format trace (no model: --no-quality), writes a TOML that
the project's config loader reads back equal, and `kvcxl simulate --config` replays it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcxl.firmware.config import PolicyConfig
from kvcxl.model.calibrate_k7 import choose_alpha_beta, write_toml

A, B = [0.05, 0.2, 0.4], [0.001, 0.1]


def test_a_consistent_gain_moves_alpha_beta() -> None:
    hit = np.full((3, 2, 3), 0.60)
    hit[0, 1] = [0.70, 0.66, 0.68]  # better on every trace
    r = choose_alpha_beta(A, B, hit, hit[1, 0].tolist(), (0.2, 0.001))
    assert r["identifiable"] and (r["alpha"], r["beta"]) == (0.05, 0.1)
    assert r["gain_over_base"][0] == pytest.approx(0.08)


def test_a_gain_inside_the_paired_interval_keeps_the_base() -> None:
    hit = np.full((3, 2, 3), 0.60)
    hit[2, 1] = [0.70, 0.55, 0.58]  # the best mean, but not on every trace
    r = choose_alpha_beta(A, B, hit, hit[1, 0].tolist(), (0.2, 0.001))
    assert (r["best"]["alpha"], r["best"]["beta"]) == (0.4, 0.1)
    assert not r["identifiable"] and (r["alpha"], r["beta"]) == (0.2, 0.001)


def test_a_flat_grid_keeps_the_base() -> None:
    hit = np.full((3, 2, 3), 0.6543)
    r = choose_alpha_beta(A, B, hit, hit[1, 0].tolist(), (0.2, 0.001))
    assert not r["identifiable"] and r["spread"] == 0.0 and r["alpha"] == 0.2


def _capture_file(tmp_path, steps: int = 64, bt: int = 4, seed: int = 0):
    """A capture-format trace of synthetic attention (sink, recent block, sparse far reads)
    on the SmolLM2 shape, with the metadata `kvcxl calibrate` checks."""
    from kvcxl.model.capture import Capture, to_trace

    rng = np.random.default_rng(seed)
    nb = -(-steps // bt)
    w = rng.gamma(0.4, 0.03, (steps, 30, 3, nb)).astype(np.float32)
    w[:, 12:, :, 0] += 0.3  # a sink in the later layers
    for t in range(steps):
        w[t, :, :, t // bt] += 0.3
        w[t, :, :, t // bt + 1 :] = 0.0
    cap = Capture(
        tokens=list(range(1, steps + 1)), prompt_tokens=steps - 8, weights=w,
        block_tokens=bt, aggregation="max",
    )  # fmt: skip
    path = tmp_path / "synthetic.npz"
    to_trace(cap, source="test synthetic").save(path)
    return path


def test_calibrate_writes_a_config_that_simulate_replays(tmp_path, capsys) -> None:
    from kvcxl.cli.main import main

    path = _capture_file(tmp_path)
    out = tmp_path / "cal"
    rc = main(["calibrate", "--trace", str(path), "--alpha", "0.05,0.2", "--beta", "0.001,0.1",
               "--budget", "16", "--no-quality", "--touch", "0.01", "--keep", "0.1",
               "--evict", "0.02", "--out", str(out),
               "--json", str(tmp_path / "c.json")])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    for needle in ("keep_threshold", "R²", "AUC", "precision", "recall", "hyperbola"):
        assert needle in text
    report = json.loads((tmp_path / "c.json").read_text())
    k7 = report["k7"]
    cfg = PolicyConfig.load(out / "calibrated.toml")
    assert cfg == PolicyConfig.from_mapping(k7["config"])
    # Each fitted value is the one its method reported.
    assert cfg.keep_threshold == k7["keep"]["keep_threshold"]
    assert cfg.evict_threshold == k7["evict"]["evict_threshold"] < cfg.keep_threshold
    assert cfg.anchor_zone_size == k7["anchor"]["anchor_zone_size"]
    assert list(cfg.placement_weights) == pytest.approx(k7["weights"]["fit"]["weights"], abs=1e-6)
    assert list(cfg.placement_cuts) == k7["weights"]["cuts"]
    for key, value in k7["prefetch"]["fitted"].items():
        assert cfg.to_dict()[key] == pytest.approx(value)
    assert (cfg.alpha, cfg.beta) == (k7["alpha_beta"]["alpha"], k7["alpha_beta"]["beta"])
    # The keep rule holds on the trace: the fitted keep serves the SLO, a larger one not.
    keep = k7["keep"]["per_trace"][0]
    assert keep["read_hit_rate"] >= k7["slo"]

    sim_json = tmp_path / "sim.json"
    rc = main(["simulate", "--trace", str(path), "--config", str(out / "calibrated.toml"),
               "--policy", "ema", "--budget", "25%", "--prefetch", "--audit",
               "--json", str(sim_json)])  # fmt: skip
    assert rc == 0
    doc = json.loads(sim_json.read_text())
    assert PolicyConfig.from_mapping(doc["config"]["config"]) == cfg
    assert doc["results"] and all(r.get("audit_faults", 0) == 0 for r in doc["results"])


def test_write_toml_refuses_nothing_it_cannot_read_back(tmp_path) -> None:
    cfg = PolicyConfig().with_(keep_threshold=0.003, evict_threshold=0.0)
    report = {"traces": ["a.npz"], "config": cfg.to_dict()}
    assert write_toml(report, tmp_path / "c.toml") == cfg
    assert (tmp_path / "c.toml").read_text().startswith("# kvcxl calibrate")
    bad = {"traces": ["a.npz"], "config": {**cfg.to_dict(), "placement_cuts": [0.7, 0.6]}}
    with pytest.raises(ValueError, match="placement_cuts"):
        write_toml(bad, tmp_path / "bad.toml")


@pytest.mark.parametrize(("flag", "value"), [("--slo", "0"), ("--breakeven", "0")])
def test_bad_options_are_refused_by_name(tmp_path, capsys, flag: str, value: str) -> None:
    from kvcxl.cli.main import main

    path = _capture_file(tmp_path, steps=16)
    rc = main(["calibrate", "--trace", str(path), "--no-quality", flag, value,
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 2
    assert flag in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.model
def test_a_real_capture_calibrates_and_replays(tmp_path, capsys) -> None:
    """The smallest real case: the chat prompt's first 160 positions of SmolLM2-135M."""
    from kvcxl.cli.main import main
    from kvcxl.model.capture import capture, load_prompt, shared_model, to_trace

    m, tok = shared_model(1)
    cap = capture(m, load_prompt("chat", tok)[:160], 0)
    path = tmp_path / "chat.npz"
    to_trace(cap, source="test chat").save(path)
    out = tmp_path / "cal"
    rc = main(["calibrate", "--trace", str(path), "--alpha", "0.05,0.2", "--beta", "0.001",
               "--budget", "64", "--no-quality", "--touch", "0.01", "--out", str(out)])  # fmt: skip
    assert rc == 0
    k7 = json.loads((out / "calibration.json").read_text())["k7"]
    cfg = PolicyConfig.load(out / "calibrated.toml")
    # SmolLM2's sink is position 0: block 0 is pinned, and the keep rule meets its SLO.
    assert cfg.anchor_zone_size >= 16
    assert k7["keep"]["per_trace"][0]["read_hit_rate"] >= 0.97
    assert k7["weights"]["fit"]["auc"] > 0.5
    rc = main(["simulate", "--trace", str(path), "--config", str(out / "calibrated.toml"),
               "--policy", "ema", "--budget", "25%", "--audit"])  # fmt: skip
    assert rc == 0
