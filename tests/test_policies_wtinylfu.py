"""W-TinyLFU: libCacheSim's WTinyLFU hit for hit, the plain reference, and its parameters.

Three checks of one policy (docs/policy.md, "W-TinyLFU"):

* libCacheSim 0.3.5's ``WTinyLFU`` on one-byte objects (its sketch then has 14.4
  counters per main entry, so hash collisions and the halving both happen): equal hits,
  with every main it takes (SLRU, LRU, FIFO, CLOCK, SIEVE, ARC; it refuses S3-FIFO);
* the same through the CLI path at pressure (``kvcxl trace export`` → ``kvcxl simulate
  --granularity request``; simulator hits = libCacheSim hits + distinct objects, as for
  the other policies in tests/test_firmware_libcachesim.py), ARC excepted (its p in bytes
  degenerates with entries of 4 KiB, docs/policy.md);
* the plain version of tests/reference_queues.py, victim for victim, at layer and request
  granularity (batches, arrivals, protected reads), with settings that make the sketch
  collide and halve, and with every main (S3-FIFO's only check beyond the fast engine's).

Equality needs whole shares, as libCacheSim's sizes are bytes truncated at each split:
the window trunc(capacity × window) and, for the SLRU main, probation + protected = main.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import reference_engine as ref
from test_sim_differential import WL_SHAPE, _stream, compare

from kvcxl.cli.main import main
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.export import ORACLE_DTYPE, next_access
from kvcxl.emu.sim.simulator import SimOptions, pick_engine, simulate
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.params import ConfigError
from kvcxl.firmware.policies.wtinylfu import MAINS
from kvcxl.firmware.replay import replay
from kvcxl.firmware.sketch import (
    SEED_A,
    SEED_B,
    counters_per_element,
    id_hashes,
    xxh64,
    xxh64_u64,
)

CLASSIC = PolicyConfig(persistent_metadata=False)


def test_xxh64_matches_the_specification_vectors():
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert xxh64(b"a", 0) == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc", 0) == 0x44BC2CF5AD770999


def test_the_integer_form_of_xxh64_is_the_byte_form():
    """The sketch hashes an id as its 8 little-endian bytes; the integer steps that both
    engines use (on Python ints and on uint64 arrays) give the byte form's hash."""
    rng = np.random.default_rng(7)
    ids = np.concatenate([np.arange(40), rng.integers(0, 1 << 62, 200), [(1 << 63) + 5]])
    ids = ids.astype(np.uint64)
    ha, hb = id_hashes(ids)
    for j, x in enumerate(ids.tolist()):
        for seed, h in ((SEED_A, ha), (SEED_B, hb)):
            want = xxh64(x.to_bytes(8, "little"), seed)
            assert xxh64_u64(x, seed) == want, (x, seed)
            assert int(h[j]) == want & 0xFFFFFFFF, (x, seed)


def test_a_main_outside_the_list_is_refused_by_name():
    names = r"'slru', 'lru', 'fifo', 'clock', 'sieve', 's3fifo' or 'arc'"
    with pytest.raises(ConfigError, match=rf"wtinylfu_main = 'lfu'.*{names}"):
        PolicyConfig.from_mapping({"wtinylfu_main": "lfu"})
    assert MAINS == ("slru", "lru", "fifo", "clock", "sieve", "s3fifo", "arc")
    for name in MAINS:
        PolicyConfig.from_mapping({"wtinylfu_main": name})


def test_a_main_too_small_for_s3fifo_is_refused_naming_both():
    from kvcxl.firmware.policies import CapacityTooSmall

    with pytest.raises(CapacityTooSmall, match=r"wtinylfu: its main cache holds 9 entries; s3fifo"):
        replay("wtinylfu", [np.array([0])], 10, config=CLASSIC.with_(wtinylfu_main="s3fifo"))


def victims(reqs: list[int], capacity: int, **params: object) -> list[int]:
    cfg = CLASSIC.with_(**params)
    res = replay("wtinylfu", [np.array([r]) for r in reqs], capacity, config=cfg,
                 record_victims=True)  # fmt: skip
    assert res.audit["wrong_victims"] == 0
    return [int(v[1]) for v in res.victims]


def test_window_victim_replaces_the_main_victim_only_when_strictly_more_frequent():
    # capacity 4, window 0.25: one window entry, an LRU main of 3.  0 1 2 3 fill the
    # window; 4: the window's tails 0 1 2 move into the main (room), then 3 (counted
    # twice: admission + this look) meets main's victim 0 (counted twice): a tie keeps 0
    # and evicts 3.  5: 4 (1 + 1) vs 0 (2): 4 goes.  Then 3 returns (3 counts, 4 once
    # considered): as window victim it beats 0 (2) and 0 is evicted.
    lru = {"wtinylfu_window": 0.25, "wtinylfu_main": "lru"}
    assert victims([0, 1, 2, 3, 4, 5, 3, 6], 4, **lru) == [3, 4, 5, 0]


# --- libCacheSim on one-byte objects --------------------------------------------------
lcs = pytest.importorskip("libcachesim")


def zipf_requests(seed: int, n: int, objects: int, a: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, objects + 1, dtype=np.float64) ** -a
    p /= p.sum()
    return rng.permutation(objects)[rng.choice(objects, size=n, p=p)]


def _write(obj: np.ndarray, path, size: int = 1) -> None:
    rec = np.empty(obj.size, dtype=ORACLE_DTYPE)
    rec["time"] = np.arange(1, obj.size + 1)
    rec["obj"] = obj  # the ids the sketch hashes are the entry ids
    rec["size"] = size
    rec["next"] = next_access(obj)
    rec.tofile(path)


def peer_hits(path, n: int, cache_bytes: int, main: str, window: float) -> int:
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    peer = lcs.WTinyLFU(cache_bytes, main_cache=main.upper(), window_size=window)
    return round(n * (1.0 - peer.process_trace(reader)[0]))


def whole(capacity: int, window: float, unit: int = 1, main: str = "slru") -> bool:
    """libCacheSim's byte shares, in objects of ``unit`` bytes, are kvcxl's entry shares."""
    w = max(1, int(capacity * window))
    m = capacity - w
    wb = int(capacity * unit * window)
    mb = capacity * unit - wb
    if wb < unit or mb // unit != m:
        return False
    if main != "slru":
        return True
    segs = [int(0.2 * m), int((1 - 0.2) * m)]
    return sum(segs) == m and segs == [int(1 / 5 * mb) // unit, int(4 / 5 * mb) // unit]


# The mains libCacheSim's WTinyLFU takes (main-cache=; it aborts on S3FIFO, tested below).
PEER_MAINS = [m for m in MAINS if m != "s3fifo"]


def test_libcachesim_refuses_s3fifo_as_the_main_cache():
    """Why S3-FIFO's main is checked against the plain reference only: the wheel aborts."""
    code = "import libcachesim as l; l.WTinyLFU(100, main_cache='{}'); print('made')"
    ok = subprocess.run([sys.executable, "-c", code.format("SIEVE")], capture_output=True,
                        text=True, timeout=120)  # fmt: skip
    assert ok.returncode == 0 and "made" in ok.stdout
    refused = subprocess.run([sys.executable, "-c", code.format("S3FIFO")], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert refused.returncode != 0 and "made" not in refused.stdout
    assert "WTinyLFU does not support S3FIFO" in refused.stdout + refused.stderr


@pytest.mark.parametrize("main", PEER_MAINS)
@pytest.mark.parametrize(
    "capacity,window,seed,a", [(40, 0.25, 5, 0.8), (55, 0.1, 1, 0.9), (100, 0.1, 2, 1.1),
                               (200, 0.05, 6, 0.7), (510, 0.02, 3, 0.9), (1000, 0.01, 4, 1.1)]
)  # fmt: skip
def test_hits_equal_libcachesim_on_one_byte_objects(tmp_path, main, capacity, window, seed, a):
    # (no audit here: the reference test below audits every pass; this one is about hits)
    assert whole(capacity, window)
    obj = zipf_requests(seed, 6000, 1500, a)
    cfg = CLASSIC.with_(wtinylfu_main=main, wtinylfu_window=window)
    batches = [obj[i : i + 1] for i in range(obj.size)]
    ours = replay("wtinylfu", batches, capacity, config=cfg, audit=False)
    _write(obj, tmp_path / "t.bin")
    theirs = peer_hits(tmp_path / "t.bin", obj.size, capacity, main, window)
    assert ours.hits == theirs, (main, capacity, window, seed, ours.hits, theirs)


def test_slru_shares_that_are_not_whole_differ_from_libcachesim(tmp_path):
    # capacity 300, window 0.01: main 297, probation 59 + protected 237 = 296.  libCacheSim's
    # probation then runs over its share, and a promotion that cools protected into it
    # evicts on a hit (which demand paging does not do): the counts differ (docs/policy.md).
    assert not whole(300, 0.01)
    obj = zipf_requests(1, 8000, 1000, 0.9)
    batches = [obj[i : i + 1] for i in range(obj.size)]
    ours = replay("wtinylfu", batches, 300, config=CLASSIC, audit=False)
    _write(obj, tmp_path / "t.bin")
    assert ours.hits != peer_hits(tmp_path / "t.bin", obj.size, 300, "slru", 0.01)


# --- libCacheSim through the CLI, at pressure -----------------------------------------
# The traces of tests/test_firmware_libcachesim.py (its newer policies' lengths).
PRESSURE = {
    "zipf-sessions": (80, "topk:2", {"lanes": 2, "turn_tokens": 1, "sessions": 24, "zipf": 0.6}),
    "cyclic": (160, "topk:2", {"lanes": 1, "turn_tokens": 3, "sessions": 8}),
    "uniform": (80, "dense", {"lanes": 2, "sessions": 12}),
}
FRACTIONS = (0.10, 0.20, 0.30)
# Windows whose shares are whole at capacities of a few hundred 4 KiB entries (1 % needs
# multiples of 500 with the SLRU main; the one-byte test above runs the default).  Not ARC:
# libCacheSim moves its p by whole bytes, below one entry of 4 KiB (docs/policy.md).
CLI_MAINS = [("slru", 0.1), ("slru", 0.2), ("lru", 0.05), ("fifo", 0.1), ("clock", 0.1),
             ("sieve", 0.05)]  # fmt: skip


def _capacity(target: int, window: float, unit: int, main: str) -> int:
    """The first capacity from ``target`` up at which the shares are whole in both forms."""
    c = max(target, 1)
    while not whole(c, window, unit, main):
        c += 1
    return c


@pytest.mark.parametrize("workload", list(PRESSURE))
@pytest.mark.parametrize("main_cache,window", CLI_MAINS)
def test_hits_at_pressure_equal_libcachesim_through_the_cli(tmp_path, workload, main_cache, window):
    steps, read, params = PRESSURE[workload]
    eb = PRESETS["ci"].entry_bytes
    npz, og, out = (tmp_path / f for f in ("t.npz", "t.bin", "r.json"))
    export = ["trace", "export", "--workload", workload, "--steps", str(steps), "--read", read,
              "--context-tokens", "256", "--reads-only", "-o", str(npz)]  # fmt: skip
    for k, v in params.items():
        export += ["--workload-param", f"{k}={v}"]
    assert main(export) == 0
    assert main(["trace", "export", "--trace", str(npz), "--format", "oracle-general",
                 "-o", str(og)]) == 0  # fmt: skip
    obj = np.fromfile(og, dtype=ORACLE_DTYPE)["obj"]
    n, distinct = int(obj.size), int(np.unique(obj).size)
    caps = sorted({_capacity(round(f * distinct), window, eb, main_cache) for f in FRACTIONS})
    # libCacheSim sizes the sketch and its reset period on the main cache's bytes: the
    # same counters per entry are entry_bytes times as many (no collisions at these sizes).
    sim = ["simulate", "--trace", str(npz), "--granularity", "request", "--policy", "wtinylfu",
           "--persistent-metadata", "off", "--wtinylfu-main", main_cache,
           "--wtinylfu-window", str(window),
           "--wtinylfu-sketch-width", repr(counters_per_element(0.001) * eb),
           "--wtinylfu-sample", str(32 * eb), "--json", str(out), "--no-progress"]  # fmt: skip
    for c in caps:
        sim += ["--budget", str(c * eb)]
    assert main(sim) == 0
    rows = json.loads(out.read_text())["results"]
    ours = {r["budget_entries"]: r["hits"] for r in rows}
    for c in caps:
        theirs = peer_hits(og, n, c * eb, main_cache, window)
        # Not vacuous: it hits, and a large share of its misses are capacity misses.
        capacity_misses = n - theirs - distinct
        assert theirs > 0 and capacity_misses > 0.15 * n, (c, theirs, n, distinct)
        assert ours[c] == theirs + distinct, (workload, c, ours[c], theirs)


# --- the plain reference, victim for victim -------------------------------------------
SETTINGS = [
    {},  # the defaults (SLRU main, 1 % window, libCacheSim's sketch)
    {"wtinylfu_main": "lru", "wtinylfu_window": 0.2},
    {"wtinylfu_main": "fifo", "wtinylfu_window": 0.1},
    {"wtinylfu_main": "clock", "wtinylfu_window": 0.1, "clock_bits": 2},
    {"wtinylfu_main": "sieve", "wtinylfu_window": 0.2},
    {"wtinylfu_main": "s3fifo", "wtinylfu_window": 0.1},
    {"wtinylfu_main": "arc", "wtinylfu_window": 0.05},
    # S3-FIFO's own parameters, ARC with a wide window; narrow sketches that halve often
    {
        "wtinylfu_main": "s3fifo",
        "wtinylfu_window": 0.3,
        "s3fifo_small_ratio": 0.3,
        "s3fifo_ghost_ratio": 0.5,
        "s3fifo_move_threshold": 1,
        "wtinylfu_sketch_width": 0.5,
        "wtinylfu_sketch_hashes": 2,
        "wtinylfu_sample": 1,
    },
    {
        "wtinylfu_main": "arc",
        "wtinylfu_window": 0.3,
        "wtinylfu_sketch_width": 0.5,
        "wtinylfu_sample": 1,
    },
    # a narrow sketch (collisions), a halving every main reuse, a wide window
    {
        "wtinylfu_window": 0.3,
        "wtinylfu_sketch_width": 0.5,
        "wtinylfu_sketch_hashes": 2,
        "wtinylfu_sample": 1,
        "wtinylfu_probation": 0.5,
    },
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(map(str, s.values())))
def test_matches_the_plain_reference(settings):
    for workload in ("zipf-sessions", "uniform"):
        stream = _stream(workload, "topk:2")
        eb = WL_SHAPE.entry_bytes
        for gran, share in (("layer", 0.3), ("request", 0.3), ("request", 0.5)):
            budget = max(int(stream.n_entries * share), 12)
            config = PolicyConfig.from_mapping({"pinned_fraction": 0.0, **settings})
            sim = simulate(
                stream,
                SimOptions(engine="numpy", policy="wtinylfu", budget_bytes=budget * eb,
                           config=config, granularity=gran, record_victims=True, audit=True),
            )  # fmt: skip
            assert sim["audit_faults"] == 0
            want = ref.replay_stream(
                stream, policy="wtinylfu", budget_bytes=budget * eb, config=config,
                granularity=gran,
            )  # fmt: skip
            desc = f"{settings} workload={workload} granularity={gran} budget={budget}"
            assert sum(len(v) for v in want["victims"].values()) > 0, desc
            compare(sim, stream, want, desc)


def test_the_fast_engine_replays_it_without_a_notice(capsys):
    """W-TinyLFU has a fast module (emu/sim/fast/policies/wtinylfu.py): no fallback, no
    notice; tests/test_sim_fast_queues.py holds the two engines equal."""
    import kvcxl.emu.sim.fast as fast

    opts = SimOptions(policy="wtinylfu", budget_bytes=1 << 20)
    assert fast.unsupported(opts) is None
    assert fast.POLICY_CODES[("wtinylfu", "float")] == "wtinylfu"
    assert pick_engine(opts) == "fast"
    assert "replaying with the numpy engine" not in capsys.readouterr().err
