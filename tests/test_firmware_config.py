"""The one validated configuration: defaults, TOML round trip, and every refusal's message."""

from __future__ import annotations

import pytest

from kvcxl.firmware.config import PARAMS, ConfigError, PolicyConfig


def test_defaults_are_the_seeds():
    c = PolicyConfig()
    assert (c.alpha, c.beta, c.anchor_zone_size, c.eviction_batch) == (0.2, 0.001, 100, 64)
    assert (c.keep_threshold, c.evict_threshold) == (0.10, 0.02)
    assert c.placement_weights == (0.25, 0.55, 0.20) and c.placement_cuts == (0.3, 0.6)
    assert (c.prefetch_window, c.prefetch_distance_scale, c.prefetch_depth) == (128, 100.0, 2)
    assert c.prefetch_blend == (0.6, 0.4) and c.persistent_metadata is True
    assert c.aggregation == "max"


def test_every_field_is_documented():
    assert set(PARAMS) == set(PolicyConfig().to_dict())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"alpha": 0.0}, r"alpha = 0.0 is out of range: must be \(0, 1\]"),
        ({"alpha": 1.5}, r"alpha = 1.5 is out of range: must be \(0, 1\]"),
        ({"alpha": float("nan")}, r"alpha = nan is out of range"),
        ({"beta": -0.1}, r"beta = -0.1 is out of range: must be \[0, 1\]"),
        (
            {"keep_threshold": 0.02, "evict_threshold": 0.02},
            r"keep_threshold = 0.02 must be greater than evict_threshold = 0.02",
        ),
        ({"keep_threshold": 0.01}, r"keep_threshold = 0.01 must be greater than evict_threshold"),
        (
            {"placement_weights": (0.3, 0.3, 0.3)},
            r"placement_weights = .* sums to 0.9: must sum to 1",
        ),
        ({"prefetch_blend": (0.5, 0.6)}, r"prefetch_blend = .* sums to 1.1: must sum to 1"),
        (
            {"placement_weights": (0.5, 0.5)},
            r"placement_weights = .* is out of range: must be three",
        ),
        ({"placement_cuts": (0.6, 0.3)}, r"placement_cuts = \(0.6, 0.3\) is out of range"),
        ({"prefetch_window": -1}, r"prefetch_window = -1 is out of range: must be \[0, 1048576\]"),
        ({"eviction_batch": 0}, r"eviction_batch = 0 is out of range: must be \[1, 65536\]"),
        ({"eviction_batch": 2.5}, r"eviction_batch = 2.5 has the wrong type: expected an integer"),
        ({"prefetch_depth": 17}, r"prefetch_depth = 17 is out of range: must be \[0, 16\] layers"),
        ({"prefetch_distance_scale": 0}, r"prefetch_distance_scale = 0 is out of range"),
        ({"aggregation": "sum"}, r"aggregation = 'sum' is out of range: must be 'max' or 'mean'"),
        ({"placement_mode": "magic"}, r"placement_mode = 'magic' is out of range"),
        (
            {"persistent_metadata": 1},
            r"persistent_metadata = 1 has the wrong type: expected true or false",
        ),
        ({"touch_threshold": 2}, r"touch_threshold = 2 is out of range: must be \[0, 1\]"),
        ({"anchor_zone_size": -5}, r"anchor_zone_size = -5 is out of range"),
        ({"decay_shift": 9}, r"decay_shift = 9 is out of range: must be \[0, 8\]"),
        ({"pinned_fraction": 1.2}, r"pinned_fraction = 1.2 is out of range"),
        ({"alpha": "0.2"}, r"alpha = '0.2' has the wrong type: expected a number"),
    ],
)
def test_refusals_name_parameter_value_and_range(changes, message):
    with pytest.raises(ConfigError, match=message):
        PolicyConfig.from_mapping(changes)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown parameter 'alpah' \(did you mean 'alpha'\?\)"):
        PolicyConfig.from_mapping({"alpah": 0.1})


def test_toml_round_trip(tmp_path):
    c = PolicyConfig(alpha=0.05, placement_mode="weighted", prefetch_blend=(0.7, 0.3))
    path = tmp_path / "policy.toml"
    c.save(path)
    assert PolicyConfig.load(path) == c


def test_toml_top_level_keys_and_errors(tmp_path):
    p = tmp_path / "a.toml"
    p.write_text("alpha = 0.1\nbeta = 0.002\n")
    assert PolicyConfig.load(p).beta == 0.002
    p.write_text("alpha = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        PolicyConfig.load(p)
    p.write_text("[policy]\nalpha = 3.0\n")
    with pytest.raises(ConfigError, match=r"alpha = 3.0 is out of range"):
        PolicyConfig.load(p)
    p.write_text("[policy]\nalpha = 0.1\n[other]\nx = 1\n")
    with pytest.raises(ConfigError, match="unexpected top-level key 'other'"):
        PolicyConfig.load(p)


def test_with_validates():
    assert PolicyConfig().with_(alpha=0.05).alpha == 0.05
    with pytest.raises(ConfigError, match="alpha"):
        PolicyConfig().with_(alpha=-1.0)
