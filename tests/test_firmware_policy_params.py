"""A policy's own parameters: declared once, listed by the policies that use them, carried
by the configuration, read by the policy as ``self.params``, reachable from every driver."""

from __future__ import annotations

import json

import pytest

from kvcxl.cli.main import main
from kvcxl.firmware.config import PARAMS, ConfigError, PolicyConfig
from kvcxl.firmware.policies import POLICIES, make_policy
from kvcxl.firmware.policy_params import POLICY_PARAMS
from kvcxl.firmware.table import EntryTable


def test_every_declared_parameter_is_used_and_every_used_one_declared():
    used = {n: p for cls in POLICIES.values() for n, p in cls.parameters.items()}
    assert set(used) == set(POLICY_PARAMS)
    for cls in POLICIES.values():
        for name, param in cls.parameters.items():
            assert param is POLICY_PARAMS[name], (cls.name, name)  # one definition
    assert not set(PARAMS) & set(POLICY_PARAMS)  # no name means two things


def test_a_policy_reads_its_own_values_and_only_its_own():
    cfg = PolicyConfig.from_mapping({"recent_tokens": 7, "lrfu_lambda": 0.5})
    table = EntryTable()
    h2o = make_policy("h2o", cfg, table)
    assert (h2o.params.recent_tokens, h2o.params.sink_tokens) == (7, 4)  # set, default
    assert vars(make_policy("lrfu", cfg, table).params) == {"lrfu_lambda": 0.5}
    assert vars(make_policy("lru", cfg, table).params) == {}
    assert cfg.effective()["seed"] == 0 and cfg.effective()["recent_tokens"] == 7
    assert cfg.with_(alpha=0.1).param("recent_tokens") == 7  # kept across a change


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"recent_tokens": -1}, r"recent_tokens = -1 is out of range: must be \[0, 1048576\]"),
        ({"lrfu_lambda": 2.0}, r"lrfu_lambda = 2.0 is out of range: must be \[0, 1\]"),
        ({"lfu_tie_break": "mru"}, r"lfu_tie_break = 'mru' is out of range"),
        ({"seed": 1.5}, r"seed = 1.5 has the wrong type: expected an integer"),
        ({"recent_token": 3}, r"unknown parameter 'recent_token' \(did you mean 'recent_tokens'"),
    ],
)
def test_bad_values_are_refused_naming_them(changes, message):
    with pytest.raises(ConfigError, match=message):
        PolicyConfig.from_mapping(changes)


def test_toml_round_trip_keeps_policy_parameters(tmp_path):
    c = PolicyConfig.from_mapping({"alpha": 0.05, "sink_tokens": 16, "lfu_tie_break": "index"})
    c.save(tmp_path / "p.toml")
    assert PolicyConfig.load(tmp_path / "p.toml") == c


def test_the_command_line_option_reaches_the_policy(tmp_path):
    runs = {}
    for window in (0, 512):
        out = tmp_path / f"{window}.json"
        rc = main(
            ["simulate", "--workload", "zipf-sessions", "--steps", "30", "--policy", "h2o",
             "--budget", "10%", "--recent-tokens", str(window), "--backend", "serial",
             "--no-progress", "--json", str(out)]
        )  # fmt: skip
        assert rc == 0
        runs[window] = json.loads(out.read_text())["results"][0]["hit_rate"]
    assert runs[0] != runs[512]


def test_a_bad_option_value_is_one_line_exit_2(capsys):
    rc = main(["simulate", "--workload", "cyclic", "--steps", "5", "--lrfu-lambda", "3"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "lrfu_lambda = 3.0 is out of range" in err and "Traceback" not in err


def test_h2o_derives_its_window_from_a_budget_when_not_given():
    assert POLICIES["h2o"].budget_params(64) == {"recent_tokens": 32}
    assert POLICIES["lru"].budget_params(64) == {}


def test_the_device_mailbox_serves_policy_parameters():
    from kvcxl.emu.device.device import Type3Device

    dev = Type3Device(policy="h2o")
    assert dev.config.effective()["recent_tokens"] == 128
    dev.set_config(dev.config.with_(recent_tokens=9))
    assert dev.policy.params.recent_tokens == 9
