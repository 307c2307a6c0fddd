"""The committed calibrated configuration (firmware/calibrated.toml): what `kvcxl calibrate`
writes (docs/calibration.md, section 5), loaded as `--config` loads it, its fitted values
the ones docs/calibration.md's section 5a reports, and the policies experiment's
"ema (calibrated)" arm replaying exactly it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from test_calibrate_k7 import _capture_file

from kvcxl.firmware import policy_params as own_params
from kvcxl.firmware.config import PARAMS, PolicyConfig

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "firmware" / "calibrated.toml"
DOC = ROOT / "docs" / "calibration.md"


def _values(path: Path) -> dict:
    return tomllib.loads(path.read_text())["policy"]


def test_it_loads_and_every_key_is_a_real_parameter() -> None:
    cfg = PolicyConfig.load(FILE)
    known = set(PARAMS) | set(own_params.table())
    assert set(_values(FILE)) <= known
    assert cfg == PolicyConfig.from_mapping(_values(FILE))


def test_it_is_what_calibrate_writes(tmp_path) -> None:
    """The same command on a small synthetic capture writes the same keys under the same
    header, and every value calibrate does not fit (the base configuration's) equal."""
    from kvcxl.cli.main import main

    path = _capture_file(tmp_path, steps=48)
    out = tmp_path / "cal"
    rc = main(["calibrate", "--trace", str(path), "--alpha", "0.2", "--beta", "0.001",
               "--budget", "16", "--no-quality", "--out", str(out)])  # fmt: skip
    assert rc == 0
    small, ours = _values(out / "calibrated.toml"), _values(FILE)
    assert list(small) == list(ours)
    fitted = {"alpha", "beta", "anchor_zone_size", "keep_threshold", "evict_threshold",
              "placement_weights", "placement_cuts", "prefetch_window",
              "prefetch_distance_scale", "prefetch_blend", "prefetch_depth"}  # fmt: skip
    assert {k: v for k, v in small.items() if k not in fitted} == {
        k: v for k, v in ours.items() if k not in fitted
    }
    head = lambda p: p.read_text().splitlines()[0].rsplit(" on ", 1)[0]  # noqa: E731
    assert head(out / "calibrated.toml") == head(FILE)
    assert FILE.read_text().splitlines()[0].endswith("chat.npz, long-doc.npz, code.npz")


def _doc_fitted() -> dict[str, str]:
    """The bold "fitted" cell of each row of docs/calibration.md's section 5a."""
    text = DOC.read_text()
    sec = text[text.index("### 5a.") : text.index("### 5b.")]
    out = {}
    for line in sec.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[2].startswith("**"):
            out[cells[0].split()[0].strip("`")] = cells[2].strip("*").split(" (")[0]
    return out


def test_its_fitted_values_are_the_documented_ones() -> None:
    doc, v = _doc_fitted(), _values(FILE)
    num = lambda s: [float(x.replace(",", "")) for x in re.findall(r"[\d.,]*\d", s)]  # noqa: E731
    assert num(doc["α,"]) == [v["alpha"], v["beta"]]
    assert num(doc["anchor_zone_size"]) == [v["anchor_zone_size"]]
    assert num(doc["keep_threshold"]) == [pytest.approx(v["keep_threshold"], abs=5e-5)]
    assert num(doc["evict_threshold"]) == [v["evict_threshold"]]
    assert num(doc["placement_weights"]) == pytest.approx(v["placement_weights"], abs=5e-4)
    assert num(doc["placement_cuts"]) == pytest.approx(v["placement_cuts"], abs=5e-4)
    assert num(doc["prefetch_distance_scale"]) == [round(v["prefetch_distance_scale"])]
    assert num(doc["prefetch_window"]) == [v["prefetch_window"]]
    assert num(doc["prefetch_depth"]) == [v["prefetch_depth"]]
    assert num(doc["prefetch_blend"]) == v["prefetch_blend"]


def test_the_experiment_arm_replays_the_file() -> None:
    from kvcxl.experiments.policies import CALIBRATED, CONFIGURED, EXPERIMENT, arms_of

    assert ROOT / CALIBRATED == FILE
    policy, config = arms_of(EXPERIMENT.cases("ci")[0])["ema (calibrated)"]
    assert CONFIGURED["ema (calibrated)"] == ("ema", CALIBRATED)
    assert policy == "ema" and PolicyConfig.from_mapping(config) == PolicyConfig.load(FILE)
