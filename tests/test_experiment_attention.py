"""``kvcxl experiment --attention``: the seed's defaults or the SmolLM2-135M fit on any shape's
layers by relative depth, kept in each case (keyed apart) and named in every caption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcxl.cli import main as cli
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.workloads.attention import (
    FITTED,
    AttentionModel,
    AttentionParams,
    attention_for,
    fitted_params,
)
from kvcxl.experiments import _common, runner, users, users_mooncake, workloads
from kvcxl.experiments.users import caption

S1 = PRESETS["s1"]
FIT_LAYERS = len(FITTED["sink_profile"])  # SmolLM2-135M's 30 layers


def _by_depth(profile, layers):
    """The docs' rule written out: layer i of n sits at relative depth i / (n − 1), and
    the fit's layer j of 30 at j / 29; a layer between two fitted ones reads the line
    between their values."""
    return np.interp(np.arange(layers) / (layers - 1), np.arange(FIT_LAYERS) / (FIT_LAYERS - 1),
                     np.asarray(profile, dtype=np.float64))  # fmt: skip


def test_the_fit_at_its_own_depth_is_the_fit():
    p = attention_for(S1.with_(layers=FIT_LAYERS), "fit")
    assert p == fitted_params() == AttentionParams().with_(**FITTED)
    assert FIT_LAYERS == 30
    for got, fit in ((p.sink_by_layer(FIT_LAYERS), FITTED["sink_profile"]),
                     (p.recent_by_layer(FIT_LAYERS), FITTED["recent_profile"])):  # fmt: skip
        np.testing.assert_array_equal(got, np.asarray(fit, dtype=np.float32))


@pytest.mark.parametrize("layers", [31, 80, 241])
def test_the_fit_on_a_deeper_shape_is_its_profiles_read_by_relative_depth(layers):
    shape = S1.with_(layers=layers)
    p = attention_for(shape, "fit")
    model = AttentionModel(shape, p, "max", seed=0)  # what the generator draws from
    for got, fit in ((model.sink, FITTED["sink_profile"]),
                     (model.recent, FITTED["recent_profile"])):  # fmt: skip
        fit = np.asarray(fit, dtype=np.float64)
        np.testing.assert_allclose(got, _by_depth(fit, layers), rtol=0, atol=1e-6)
        assert got[0] == np.float32(fit[0]) and got[-1] == np.float32(fit[-1])
        # monotone between neighbours: each layer lies between the two fitted layers around it
        j = np.minimum(np.floor(np.arange(layers) / (layers - 1) * (FIT_LAYERS - 1)).astype(int),
                       FIT_LAYERS - 2)  # fmt: skip
        lo, hi = np.minimum(fit[j], fit[j + 1]), np.maximum(fit[j], fit[j + 1])
        assert np.all(got >= lo - 1e-6) and np.all(got <= hi + 1e-6)


def test_the_choice_changes_the_stream_and_the_run_key():
    fp = runner.fingerprint("ladder")
    for scale, name, other in (("tiny", "ladder", "seed"), ("mid", "ladder", "fit")):
        own = runner.cases_of(name, scale)[0]
        chosen = runner.cases_of(name, scale, attention=other)[0]
        assert chosen == {**own, "attention": other}  # nothing else of the case changes
        assert runner.key(name, chosen, 0, fp) != runner.key(name, own, 0, fp)
        # the scale's own choice leaves the case (and the resume key) as it was
        mine = "fit" if other == "seed" else "seed"
        assert runner.cases_of(name, scale, attention=mine) == runner.cases_of(name, scale)
    # tiny's own is the fit; the seed's defaults give another stream of the same workload
    case = runner.cases_of("ladder", "tiny", runner.parse_where(["workload=uniform"]))[0]
    case = {**case, "workload": "multi-turn"}
    fit, seed = (_common.stream(c, 0) for c in (case, {**case, "attention": "seed"}))
    assert fit.info["attention"] == fitted_params().to_dict()
    assert seed.info["attention"] == AttentionParams().to_dict()
    assert fit.n_reads == seed.n_reads  # the same workload, the same top-k reads …
    assert not np.array_equal(fit.w, seed.w)  # … under other weights
    # the users experiments' scaled S1 runs the seed's defaults unless the case chooses
    users = runner.cases_of("users", "tiny", attention="fit")
    assert all(c["attention"] == "fit" for c in users)
    assert runner.cases_of("users", "tiny", attention="seed") == runner.cases_of("users", "tiny")


class _Replayed(Exception):
    """Raised by a stand-in simulator with the stream it was handed."""


def _stop(st, opts):
    raise _Replayed(st)


def test_the_users_experiments_generate_the_chosen_attention(monkeypatch):
    monkeypatch.setattr(users, "simulate", _stop)
    monkeypatch.setattr(users_mooncake, "simulate", _stop)
    for name, exp in (("users", users.EXPERIMENT), ("users-mooncake", users_mooncake.EXPERIMENT)):
        for choice, params in ((None, AttentionParams()), ("fit", fitted_params())):
            case = runner.cases_of(name, "tiny", attention=choice)[0]
            with pytest.raises(_Replayed) as got:
                exp.run(case, 0)
            assert got.value.args[0].info["attention"] == params.to_dict(), (name, choice)


def _replay(st, case, policy, budget="10%", prefetch=False, **config):
    """A stand-in for one arm's replay: the caption, not the hit rate, is checked here."""
    return {"hit_rate": 0.5, "effective_latency_ns": 100.0, "tokens_per_s": 1.0,
            "stall_p50_ns": 0.0, "stall_p95_ns": 0.0, "stall_p99_ns": 0.0}  # fmt: skip


def test_every_caption_names_the_attention_that_ran(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(workloads, "replay", _replay)
    out, js = tmp_path / "o", tmp_path / "r.json"
    argv = ["experiment", "workloads", "--scale", "tiny", "--seeds", "1", "--no-progress",
            "--out", str(out), "--json", str(js), "--backend", "serial",
            "--where", "workload=uniform"]  # fmt: skip
    assert cli.main([*argv, "--attention", "seed"]) == 0
    md = capsys.readouterr().out
    assert "attention: synthetic, the seed's defaults (--attention seed)." in md
    assert "fitted to SmolLM2" not in md
    doc = json.loads(js.read_text())
    assert doc["attention"] == "seed"
    assert [r["attention"] for r in doc["experiments"]["workloads"]["rows"]] == ["seed"]
    tables = doc["experiments"]["workloads"]["tables"]
    assert all("the seed's defaults (--attention seed)" in t for t in tables)
    # the default runs are keyed apart: none of them is found done
    fps = {"workloads": runner.fingerprint("workloads")}
    where = runner.parse_where(["workload=uniform"])
    todo, _, total = runner.plan(["workloads"], "tiny", 1, out, fps, where)
    assert len(todo) == total == 1
    assert not runner.plan(["workloads"], "tiny", 1, out, fps, where, attention="seed")[0]
    # captions at the other scales and in the users experiments
    mid = runner.cases_of("ladder", "mid", attention="fit")[0]
    assert _common.attention_of(mid) == (
        "synthetic, fitted to SmolLM2-135M averaged onto 8 layers by relative depth "
        "(--attention fit)"
    )
    s1 = runner.cases_of("users", "s1", attention="fit")[0]
    assert caption([{**s1, "seed": 0}]).endswith(
        "attention: synthetic, fitted to SmolLM2-135M stretched over 80 layers by relative "
        "depth (--attention fit)."
    )
    assert caption([{**runner.cases_of("users", "s1")[0], "seed": 0}]).endswith(
        "attention: synthetic, the seed's defaults."
    )


def test_a_bad_choice_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse refuses it before anything runs
        cli.main(["experiment", "ladder", "--attention", "stretched"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'stretched'" in err and "'seed'" in err and "'fit'" in err
    with pytest.raises(ValueError, match=r"attention 'stretched': must be one of 'seed', 'fit'"):
        runner.cases_of("ladder", "tiny", attention="stretched")
    with pytest.raises(ValueError, match="'stretched'"):
        attention_for(S1, "stretched")
