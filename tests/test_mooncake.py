"""Mooncake's request traces: the import's facts against a plain reader written here from
the data's README, every malformed line refused by file, line and field, and the mapping
to a workload (same hash = same entries; arrival step and decode steps per request)."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cli import main as cli
from kvcxl.emu.serving import workload_turns
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.mooncake import (
    DATA_DIR,
    TRACES,
    MooncakeError,
    read_requests,
    trace_facts,
)

FILES = {name: DATA_DIR / f for name, f in TRACES.items()}
SHAPE = PRESETS["ci"].with_(context_tokens=8192)  # no request of the windows is cut


def plain_facts(path: Path) -> dict:
    """The README's fields, read with json + lzma alone."""
    with lzma.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    ids = [h for r in rows for h in r["hash_ids"]]
    return {
        "requests": len(rows),
        "input_tokens": sum(r["input_length"] for r in rows),
        "output_tokens": sum(r["output_length"] for r in rows),
        "block_reads": len(ids),
        "distinct_blocks": len(set(ids)),
        # a hit is a read of an id seen before: every read but each id's first
        "infinite_cache_hit_ratio": (len(ids) - len(set(ids))) / len(ids),
    }


@pytest.mark.parametrize("name", sorted(FILES))
def test_facts_equal_a_plain_reader(name: str) -> None:
    got = trace_facts(read_requests(name))
    want = plain_facts(FILES[name])
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), (name, k)


def test_the_data_and_its_attribution_are_committed() -> None:
    assert "Apache License" in (DATA_DIR / "LICENSE-APACHE").read_text()
    readme = (DATA_DIR / "README.md").read_text()
    assert "kvcache-ai/Mooncake" in readme and "Apache" in readme


@pytest.mark.parametrize("name", sorted(FILES))
def test_hash_ids_are_prefix_hashes(name: str) -> None:
    """What the mapping relies on: an id sits at one position, and a request that holds an
    id seen before holds the whole prefix before it as it was seen."""
    seen_at: dict[int, int] = {}
    prefix_of: dict[int, tuple[int, ...]] = {}
    for r in read_requests(name):
        for i, h in enumerate(r.hash_ids):
            assert seen_at.setdefault(h, i) == i
            assert prefix_of.setdefault(h, r.hash_ids[:i]) == r.hash_ids[:i]


GOOD = {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}
BAD = [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "hash_ids"}), "'hash_ids' is missing"),
    (json.dumps({**GOOD, "timestamp": -1}), "'timestamp' = -1"),
    (json.dumps({**GOOD, "timestamp": 1.5}), "'timestamp' = 1.5 is not an integer"),
    (json.dumps({**GOOD, "timestamp": 2}), "'timestamp' = 2 goes back"),
    (json.dumps({**GOOD, "input_length": 0}), "'input_length' = 0"),
    (json.dumps({**GOOD, "input_length": True}), "'input_length' = True"),
    (json.dumps({**GOOD, "output_length": "3"}), "'output_length' = '3'"),
    (json.dumps({**GOOD, "hash_ids": 7}), "'hash_ids' must be a list"),
    (json.dumps({**GOOD, "hash_ids": [1, -2]}), "'hash_ids[1]' = -2"),
    (json.dumps({**GOOD, "hash_ids": [1]}), "'hash_ids' has 1 ids; input_length 600 needs 2"),
    (json.dumps({**GOOD, "hash_ids": [1, 1]}), "repeats an id"),
]


@pytest.mark.parametrize(("line", "says"), BAD)
def test_a_malformed_line_is_named(tmp_path: Path, line: str, says: str) -> None:
    f = tmp_path / "t.jsonl"
    first = json.dumps({**GOOD, "timestamp": 3})
    f.write_text(f"{first}\n\n{line}\n")
    with pytest.raises(MooncakeError) as e:
        read_requests(str(f))
    assert f"{f}:3" in str(e.value) and says in str(e.value), str(e.value)


def test_a_corrupt_or_missing_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl.xz"
    f.write_bytes(b"not xz at all")
    with pytest.raises(MooncakeError, match="cannot be read"):
        read_requests(str(f))
    with pytest.raises(MooncakeError, match="no such file"):
        read_requests(str(tmp_path / "absent.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(MooncakeError, match="no requests"):
        read_requests(str(tmp_path / "empty.jsonl"))


def test_cli_refuses_a_bad_line_in_one_line(tmp_path: Path, capsys) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({**GOOD, "output_length": -4}) + "\n")
    assert cli.main(["trace", "import", "--format", "mooncake", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{f}:1" in err[0] and "output_length" in err[0], err


def test_cli_prints_the_facts_and_writes_a_trace(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.npz"
    argv = ["trace", "import", "--format", "mooncake", "synthetic", "--json", "--steps", "8",
            "--context-tokens", "8192", "-o", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trace"]["requests"] == plain_facts(FILES["synthetic"])["requests"]
    assert doc["window"]["truncated_requests"] == 0
    assert out.exists() and doc["output"]["records"] > 0


@pytest.mark.parametrize("name", ["mooncake", "mooncake-synthetic"])
def test_same_hash_is_the_same_entries(name: str) -> None:
    """Every prompt block of every request in the window: one entry set per hash id, and
    different ids never share entries."""
    steps = 40
    wl = make_workload(name, SHAPE, seed=1)
    assert wl.truncated(steps) == 0
    st = compile_workload(wl, steps, read="topk:4")
    by_hash: dict[int, bytes] = {}
    by_entries: dict[bytes, int] = {}
    checked = 0
    for i, r in enumerate(wl.requests):
        if wl.arrival_step(r) >= steps:
            break
        g = st.grids[i]
        for j, h in enumerate(r.hash_ids):
            key = np.ascontiguousarray(g[:, :, j]).tobytes()
            assert (g[:, :, j] >= 0).all()
            assert by_hash.setdefault(h, key) == key, (i, j, h)
            assert by_entries.setdefault(key, h) == h, (i, j, h)
            checked += 1
    assert checked > 100 and len(by_hash) < checked  # some prefix reuse in the window


@pytest.mark.parametrize("name", ["mooncake", "mooncake-synthetic"])
def test_arrivals_and_decode_steps(name: str) -> None:
    """Request i prefills in step floor(t_i / step_ms) and decodes ceil(out_i · scale) steps
    from it: the decoding contexts of every step, recomputed here."""
    steps, itl = 30, 40.0
    wl = make_workload(name, SHAPE, seed=0, itl_ms=itl)
    scale = SHAPE.block_tokens / 512
    step_ms = itl / scale
    want = [set() for _ in range(steps)]
    for i, r in enumerate(wl.requests):
        a = int(r.timestamp_ms // step_ms)
        for s in range(a, min(steps, a + max(1, math.ceil(r.output_length * scale)))):
            want[s].add(i)
    got = [set(p.decode) for p in wl.plans(steps)]
    assert got == want
    turns = workload_turns(make_workload(name, SHAPE, seed=0, itl_ms=itl), steps)
    assert {c for _s, c, _p in turns} == set().union(*want)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="itl_ms"):
        make_workload("mooncake", SHAPE, itl_ms=0)
    with pytest.raises(ValueError, match="token_scale"):
        make_workload("mooncake", SHAPE, token_scale=2)


def plain_requests(name: str) -> list[dict]:
    with lzma.open(FILES[name], "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("rate", [0.5, 2.0])
def test_the_rate_factor_compresses_the_clock(rate: float) -> None:
    """Timestamps divided by ``rate``: request i arrives in step floor(t_i / rate / step_ms)
    (recomputed here from the file), so ``steps`` steps at rate r replay the requests of
    r · steps steps at rate 1, at r times their concurrency."""
    steps, itl = 96, 40.0  # long beside the requests' ~11 decode steps
    step_ms = itl * 512 / SHAPE.block_tokens
    scale = SHAPE.block_tokens / 512
    rows = plain_requests("conversation")
    want = [set() for _ in range(steps)]
    for i, r in enumerate(rows):
        a = math.floor(r["timestamp"] / rate / step_ms)
        for s in range(a, min(steps, a + max(1, math.ceil(r["output_length"] * scale)))):
            want[s].add(i)
    wl = make_workload("mooncake", SHAPE, seed=0, itl_ms=itl, rate=rate)
    assert [set(p.decode) for p in wl.plans(steps)] == want
    # the same requests as rate 1 over rate · steps steps (so, every decode step counted,
    # exactly rate times the mean concurrency) ...
    one = make_workload("mooncake", SHAPE, seed=0, itl_ms=itl)
    wide = round(rate * steps)
    assert wl.window(steps) == one.window(wide)
    # ... and as replayed (decode steps past the window's end cut): within 10 % of it
    got = sum(len(s) for s in want) / steps
    base = sum(len(p.decode) for p in one.plans(wide)) / wide
    assert got / base == pytest.approx(rate, rel=0.1)


@pytest.mark.parametrize("bad", [0, 1e-4, 1e4, float("nan"), float("inf")])
def test_a_rate_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"rate = .* out of range"):
        make_workload("mooncake", SHAPE, rate=bad)
