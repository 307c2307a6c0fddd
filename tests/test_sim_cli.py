"""The simulator's command line: JSON schema, sizing, trace actions, errors as one line."""

from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import pytest

from kvcxl.cli import sim as commands
from kvcxl.cli.main import main
from kvcxl.firmware.config import PARAMS
from kvcxl.firmware.policy_params import POLICY_PARAMS

ROW_KEYS = {
    "policy": str,
    "budget_bytes": int,
    "hit_rate": float,
    "byte_miss_ratio": float,
    "effective_latency_ns": float,
    "audited_victims": int,
    "wrong_victims": int,
}


def test_policy_options_cover_every_parameter():
    # the engine's parameters and every policy's own
    assert set(commands.POLICY_OPTIONS) == set(PARAMS) | set(POLICY_PARAMS)


def test_simulate_json_schema(tmp_path, capsys):
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    victims = tmp_path / "v.csv"
    rc = main(
        ["simulate", "--workload", "cyclic", "--steps", "30", "--policy", "lru", "--policy",
         "ema", "--budget", "10%", "--budget", "64KiB", "--seeds", "2", "--audit", "--json",
         str(out), "--plot", str(png), "--alpha", "0.05", "--backend", "serial",
         "--no-progress", "--dump-victims", str(victims)]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["evidence"] == "Simulated"
    assert doc["config"]["config"]["alpha"] == 0.05
    assert len(doc["results"]) == 4
    # every run evicts (both budgets are below the cyclic sweep's KV): the audit checked each
    # victim the run made (the dump lists them, both seeds), and none was wrong
    evicted = Counter(
        (v["policy"], v["budget"]) for v in csv.DictReader(victims.read_text().splitlines())
    )
    for row in doc["results"]:
        for k, typ in ROW_KEYS.items():
            assert isinstance(row[k], typ), (k, row[k])
        made = evicted[row["policy"], row["budget"]]
        assert made > 0 and row["audited_victims"] == made, (row["policy"], row["budget"])
        assert row["wrong_victims"] == 0 and row["audit_faults"] == 0
        assert row["seeds"] == 2 and row["hit_rate_ci95"] is not None
    assert {r["budget_bytes"] for r in doc["results"] if r["budget"] == "64KiB"} == {65536}
    assert png.stat().st_size > 1000
    assert "hit rate" in capsys.readouterr().out


def test_simulate_bad_values_are_one_line_errors(capsys):
    assert main(["simulate", "--policy", "nope", "--no-progress"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # refused by argparse, before any work
        main(["simulate", "--budget", "12 parsecs", "--no-progress"])
    assert exc.value.code == 2
    assert "size '12 parsecs' is not understood" in capsys.readouterr().err
    assert main(["simulate", "--alpha", "1.5", "--no-progress"]) == 2
    assert "alpha = 1.5 is out of range" in capsys.readouterr().err
    assert main(["simulate", "--read", "topk:0", "--no-progress"]) == 2
    assert "top-k" in capsys.readouterr().err


def test_dump_victims(tmp_path):
    path = tmp_path / "v.csv"
    rc = main(["simulate", "--workload", "flood", "--steps", "20", "--policy", "ema",
               "--budget", "10%", "--dump-victims", str(path), "--no-progress"])  # fmt: skip
    assert rc == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "seed,policy,budget,step,context,layer,head,block,priority"
    assert len(lines) > 1 and lines[1].startswith("0,ema,10%,")


def test_sizing_cli(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["sizing", "--preset", "s1", "--users", "8", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["evidence"] == "Analytical model" and r["kv_kib_per_token"] == 320
    assert "320 KiB" in capsys.readouterr().out


def test_trace_export_validate_info(tmp_path, capsys):
    npz, csv, og = tmp_path / "w.npz", tmp_path / "w.csv", tmp_path / "w.bin"
    for fmt, path in (("npz", npz), ("csv", csv), ("oracle-general", og)):
        assert main(["trace", "export", "--workload", "retrieval", "--steps", "5",
                     "--format", fmt, "-o", str(path)]) == 0  # fmt: skip
    assert main(["trace", "validate", str(npz)]) == 0
    assert main(["trace", "info", str(npz), "--json"]) == 0
    out = capsys.readouterr().out
    info = json.loads(out[out.index("{") :])
    n = info["records"]
    assert len(csv.read_text().splitlines()) == n
    assert og.stat().st_size == 24 * n
    rec = np.fromfile(og, dtype=[("t", "<u4"), ("o", "<u8"), ("s", "<u4"), ("n", "<i8")])
    # Next-access times point at the same object's next request (1-based) or are -1.
    nxt = rec["n"]
    has = nxt > 0
    assert np.all(rec["o"][nxt[has] - 1] == rec["o"][has]) and np.all(
        nxt[has] - 1 > np.flatnonzero(has)
    )
    # Replaying the exported npz gives the same reads.
    assert main(["simulate", "--trace", str(npz), "--policy", "lru", "--budget", "50%",
                 "--no-progress"]) == 0  # fmt: skip


def test_trace_validate_refuses_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as f:
        np.savez(f, step=np.array([1.5]))
    assert main(["trace", "validate", str(bad)]) == 2
    assert "missing array 'meta'" in capsys.readouterr().err


def test_ci_shrinks_as_seeds_grow():
    from kvcxl.emu.sim.sweep import SweepSpec, combine, run_sweep

    widths = []
    for n in (3, 12):
        spec = SweepSpec(workload="uniform", steps=15, seeds=list(range(n)), policies=["lru"],
                         budgets=["20%"])  # fmt: skip
        (row,) = combine(run_sweep(spec, backend="serial"))
        widths.append(row["hit_rate_ci95"])
    assert widths[1] < widths[0]


def test_config_file_and_option_override(tmp_path):
    from kvcxl.firmware.config import PolicyConfig

    toml = tmp_path / "p.toml"
    PolicyConfig(alpha=0.1, beta=0.01).save(toml)
    out = tmp_path / "r.json"
    argv = ["simulate", "--workload", "uniform", "--steps", "8", "--policy", "ema"]
    argv += ["--config", str(toml), "--beta", "0.002", "--json", str(out), "--no-progress"]
    rc = main(argv)
    assert rc == 0
    cfg = json.loads(out.read_text())["config"]["config"]
    assert cfg["alpha"] == 0.1 and cfg["beta"] == 0.002
    assert json.loads(out.read_text())["results"][0]["alpha"] == 0.1


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subparsers(sub)


def test_no_help_text_prints_a_doubled_percent():
    import contextlib
    import io

    import pytest

    # argparse %-formats `help` strings but prints `description` and `epilog` verbatim,
    # so an escaped "%%" there reaches the user as a literal "%%".
    from kvcxl.cli.main import build_parser
    from kvcxl.emu.sim.sweep import main as sweep_main

    parsers = [build_parser(), *_subparsers(build_parser())]
    assert len(parsers) > 20
    for p in parsers:
        text = p.format_help()
        assert "%%" not in text, p.prog
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        sweep_main(["--help"])
    assert "%%" not in out.getvalue() and "10 % and 20 %" in out.getvalue()
