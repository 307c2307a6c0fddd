"""One t table, one timing model, one size grammar for every part and command."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcxl.cli.main import build_parser
from kvcxl.common.sizes import parse_size
from kvcxl.emu.device import timing as device_timing
from kvcxl.emu.metrics import linear_percentiles, mean_ci, t975
from kvcxl.emu.timing import CXL_DRAM, HBM, NVME, TierParams, TierTiming
from kvcxl.model.calibrate import ci95

# Student's t 0.975 quantiles (scipy.stats.t.ppf(0.975, df)).
T975_EXACT = {
    1: 12.7062,
    2: 4.3027,
    5: 2.5706,
    10: 2.2281,
    30: 2.0423,
    35: 2.0301,
    40: 2.0211,
    50: 2.0086,
    60: 2.0003,
    90: 1.9867,
    120: 1.9799,
    1000: 1.9623,
    math.inf: 1.9600,
}


@pytest.mark.parametrize("df", sorted(T975_EXACT))
def test_t975_matches_the_exact_quantiles(df):
    assert t975(df) == pytest.approx(T975_EXACT[df], abs=5e-4)


def test_t975_refuses_no_degrees_of_freedom():
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


QS = (0, 1, 25, 33.3, 50, 66.7, 95, 99, 99.9, 100)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 60, 61, 101, 1000])
def test_linear_percentiles_are_numpys(n):
    """Compared with np.percentile itself, bit for bit: continuous values, many ties (where
    a neighbour difference is 0), values of mixed magnitude, and a single value."""
    rng = np.random.default_rng(n)
    for x in (
        rng.random(n) * 1e5,
        rng.integers(0, 3, n).astype(np.float64) * 123.456,
        rng.standard_normal(n) * 10.0 ** rng.integers(-3, 9, n),
    ):
        ours = np.array(linear_percentiles(x, QS))
        theirs = np.percentile(x, QS)
        assert np.array_equal(ours.view(np.int64), theirs.view(np.int64)), (n, ours - theirs)
    # A NaN in the sample (a seed with no stall figure): every percentile NaN, as numpy's.
    x = np.append(rng.random(n), np.nan)
    assert np.isnan(linear_percentiles(x, QS)).all() and np.isnan(np.percentile(x, QS)).all()


@pytest.mark.parametrize(
    ("values", "qs", "match"),
    [([], (50,), "empty"), ([1.0], (101,), "percentile 101"), ([1.0], (-1,), "percentile -1")],
)
def test_linear_percentiles_refuse_bad_input(values, qs, match):
    with pytest.raises(ValueError, match=match):
        linear_percentiles(values, qs)


@pytest.mark.parametrize("n", [2, 3, 10, 31, 32, 45, 200])
def test_calibration_intervals_use_the_one_t_table(n):
    """The calibration's per-prompt interval is the simulator's per-seed one (also > 30 d.o.f.)."""
    x = np.random.default_rng(n).random(n)
    mean, half = ci95(x)
    s = mean_ci(x)
    assert (mean, half) == (s["mean"], s["ci95"])
    assert half == pytest.approx(t975(n - 1) * x.std(ddof=1) / math.sqrt(n))


def test_one_set_of_tier_parameters():
    sim = TierTiming()
    assert (sim.cxl_latency_ns, sim.cxl_gbps) == (CXL_DRAM.latency_ns, CXL_DRAM.bandwidth_gbps)
    assert (sim.nvme_latency_ns, sim.nvme_gbps) == (NVME.latency_ns, NVME.bandwidth_gbps)
    assert (sim.hbm_latency_ns, sim.hbm_gbps) == (HBM.latency_ns, HBM.bandwidth_gbps)
    assert (NVME.latency_ns, NVME.bandwidth_gbps) == (25_000.0, 14.0)  # PCIe Gen5 x4
    assert (CXL_DRAM.latency_ns, CXL_DRAM.bandwidth_gbps) == (200.0, 64.0)
    # The device's queues start from the same parameters.
    import inspect

    from kvcxl.emu.device.device import Type3Device

    params = inspect.signature(Type3Device).parameters
    assert params["dram_timing"].default is CXL_DRAM and params["nvme_timing"].default is NVME
    q = device_timing.TierQueue(NVME)
    assert q.serve(0.0, 4096) == pytest.approx(NVME.access_ns(4096))
    for code in (0, 1, 2, 3):
        assert sim.access_ns(code, 4096) == pytest.approx(sim.tier(code).access_ns(4096))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"nvme_gbps": 0.0}, "nvme_gbps"),
        ({"cxl_latency_ns": -1.0}, "cxl_latency_ns"),
        ({"hbm_gbps": math.nan}, "hbm_gbps"),
        ({"compute_base_ms": -1.0}, "compute_base_ms"),
    ],
)
def test_tier_timing_refuses_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        TierTiming(**kw)


def test_tier_params_refuse_bad_values():
    with pytest.raises(ValueError, match="dram_gbps"):
        TierParams("dram", 200.0, 0.0)
    with pytest.raises(ValueError, match="dram_latency_ns"):
        TierParams("dram", math.inf, 64.0)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("0x1000", 4096),
        ("256M", 256 * 10**6),
        ("256MB", 256 * 10**6),
        ("256MiB", 256 * 2**20),
        ("256mib", 256 * 2**20),
        ("2GB", 2 * 10**9),
        ("1GiB", 2**30),
        ("4KiB", 4096),
        ("4K", 4000),
        ("1TiB", 2**40),
        ("1.5KiB", 1536),
        (8192, 8192),
    ],
)
def test_size_grammar(text, size):
    assert parse_size(text) == size


def test_size_percentages_need_a_total():
    assert parse_size("25%", 1000) == 250
    with pytest.raises(ValueError, match="relative to"):
        parse_size("25%")
    with pytest.raises(ValueError, match="not understood"):
        parse_size("12 parsecs")


def test_every_command_reads_sizes_alike():
    """`device serve` reads 256M as simulate does (decimal); binary needs MiB."""
    p = build_parser()
    dev = p.parse_args(["device", "serve", "--socket", "s", "--capacity", "256M"])
    assert dev.capacity == 256 * 10**6
    dev = p.parse_args(["device", "serve", "--socket", "s", "--capacity", "256MiB"])
    assert dev.capacity == 256 << 20
    # Defaults keep their byte counts.
    dev = p.parse_args(["device", "serve", "--socket", "s"])
    assert (dev.capacity, dev.page_bytes) == (1 << 30, 4096)
    assert p.parse_args(["device", "soak"]).span == 4 << 20
    with pytest.raises(SystemExit):
        p.parse_args(["device", "serve", "--socket", "s", "--capacity", "25%"])
