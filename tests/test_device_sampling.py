"""Hotness by sampling (emu/device/sampling.py): each step a sample of the DIRECT pages is
trapped, a sampled page's first touch comes to the device and makes it DIRECT again, and
the step's touched pages are estimated from what was seen, checked against a plain
computation from the docs and against the full count."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.cxl import mem
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.pagestate import DIRECT, TRAP, PageState
from kvcxl.emu.device.sampling import PageSampler

MIB = 1 << 20


def test_a_sample_traps_only_direct_pages_and_counts_the_first_touch(tmp_path) -> None:
    ps = PageState(tmp_path / "ps.bin", 1000, 12)
    ps.state[:] = DIRECT
    ps.state[100:110] = TRAP  # on NVMe, say: seen on every access anyway
    s = PageSampler(0, 999, 0.25, seed=1)
    n = s.arm(ps)
    assert 150 < n < 350  # about a quarter of the 990 DIRECT pages
    assert not s.sampled[100:110].any() and s.visible[100:110].all()
    sampled = np.flatnonzero(s.sampled)
    assert (ps.state[sampled] == TRAP).all()
    p = int(sampled[0])
    assert s.touched(p) and not s.touched(p)  # the first touch only
    ps.close()


def test_the_estimate_is_the_docs_formula(tmp_path) -> None:
    ps = PageState(tmp_path / "ps.bin", 420, 12)
    ps.state[:] = DIRECT
    ps.state[:40] = TRAP
    s = PageSampler(10, 409, 0.5, seed=3)  # a window that starts past page 0
    s.arm(ps)
    rng = np.random.default_rng(0)
    touched = np.unique(rng.integers(0, 420, 120))  # some outside the window
    # plain: seen pages that were always visible count once, sampled ones 1/rate each
    plain = 0.0
    for p in touched.tolist():
        if 10 <= p <= 409:
            i = p - 10
            plain += 1.0 if ps.state[p] == TRAP and not s.sampled[i] else 0.0
            plain += 2.0 if s.sampled[i] else 0.0
    assert s.estimate(touched) == pytest.approx(plain)
    ps.close()


def test_bad_rates_are_refused() -> None:
    for rate in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="sample rate"):
            PageSampler(0, 9, rate)


def _read(dev: Type3Device, dpa: int) -> None:
    dev.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag=0, addr=dpa >> 6))


def test_the_device_learns_reads_through_samples_at_full_rate(tmp_path) -> None:
    """Rate 1: every DIRECT KV page is trapped each step, so each page read is seen
    once (then mapped again) and the estimate equals the full count."""
    dev = Type3Device(
        256 * MIB, dram_file=tmp_path / "d.bin", page_state=tmp_path / "ps.bin",
    )  # fmt: skip
    dev.hdm.program(0, base=0, size=dev.capacity)
    dev.hdm.commit(0)
    dev.sample_rate = 1.0
    base = 16 * MIB
    dev.open_kv(32, 4096, capacity=8, block_tokens=16, base=base)
    ps, kt = dev.page_state, dev.kv_traffic
    first = base >> 12
    assert (ps.state[first : first + 32] == TRAP).all()  # all sampled
    for e in (1, 5, 9):
        _read(dev, base + e * 4096)
        _read(dev, base + e * 4096 + 64)  # a second access: the page is DIRECT again
        assert ps.state[first + e] == DIRECT
    kt.expect(np.array([1, 5, 9]))
    dev.end_step(0)
    st = kt.stats()
    assert st["disagreeing_steps"] == 0
    assert st["sampling"] == {"rate": 1.0, "pages_read": 3, "pages_estimated": 3.0, "error": 0.0}
    assert (ps.state[first : first + 32] == TRAP).all()  # re-armed for the next step
    dev.close()
