"""DIRECT pages as guest RAM (``kvcxl qemu boot --alias``, QEMU's ``kvcxl-alias=on``).

Two boots (about 1 min each).  The first: the agent's ``widths`` jobs load and store
every width over a 64 KiB area whose first four pages the device keeps trapped and whose
last eight it moves to NVMe and back without pause (``--churn``), while the pages it holds in
DRAM are mapped into the guest as RAM.  A page that leaves DRAM is unmapped (and every
vCPU has dropped it) before its bytes move; the device checks at each move out of DRAM
and every 5 ms that no page QEMU maps is outside DRAM.  Then the ``bench`` job copies to
and from the device's last 4 MiB, and the device's counts show that the copies went
through the guest-RAM mapping: no CXL.mem request and no access QEMU completed there.  How
fast that is, against guest RAM, is a benchmark figure (``kvcxl bench --only
qemu_boot_kvcxl_alias``), not a check: a loaded machine moves it by a factor of several.
The second replays the default trace with every DIRECT KV page sampled each step.

The first boot runs twice, under TCG and under KVM (``--accel kvm``, the mapped pages then
being KVM memory slots the guest reaches with no exit at all); where KVM is not usable the
KVM run is skipped with the reason (``kvm_host``)."""

from __future__ import annotations

import pytest

from kvcxl.cxl import ring as L
from kvcxl.qemu.boot import guest_result

pytestmark = [pytest.mark.slow, pytest.mark.qemu]

TRAP = ((L.WIDTHS_BASE, 16 << 10),)
CHURN = ((L.WIDTHS_BASE + (32 << 10), 32 << 10),)


@pytest.fixture(scope="module", params=["tcg", "kvm"])
def alias_boot(request, patched_host):
    from kvcxl.qemu.boot import BootOptions, boot, failure_summary

    if request.param == "kvm":
        request.getfixturevalue("kvm_host")  # skips, with the reason, where KVM is not usable
    r, _b = boot(
        BootOptions(qemu="kvcxl", jobs=("widths", "widths_in_line", "bench"), plugin=False,
                    trap=TRAP, churn=CHURN, alias=True, accel=request.param, timeout=900)
    )  # fmt: skip
    guest_result(r, "bench")  # else: fails with what the guest and the device said
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    assert "poweroff" in {e["event"] for e in r["events"]}, failure_summary(r)
    return r


def test_region_comes_up(alias_boot) -> None:
    """Linux's CXL stack commits the region and hands it to device DAX (under either
    accelerator: under KVM ``hypervisor=off`` keeps the region's cache flush allowed)."""
    r = alias_boot
    assert f"-accel {r['qemu']['accel']}" in r["qemu"]["command"]
    assert r["region"]["size"] == hex(256 << 20)
    regions = [x for part in r["cxl_list"] for x in part.get("regions", [])]
    assert regions and regions[0]["decode_state"] == "commit", r["cxl_list"]
    assert r["timings"]["boot_to_region_ready_s"] > 0


def test_guest_writes_through_the_alias_lose_no_byte_while_pages_move(alias_boot) -> None:
    r = alias_boot
    for job in ("widths_in_line", "widths"):
        w = r["guest"][job]
        assert w["ops"] == 40000, w
        assert w["bad_bytes"] == 0, [e for e in r["events"] if e["event"] == "widths_bad"]
    assert guest_result(r, "widths")["straddling"] > 5000
    # the device's bytes (whichever tier) are the guest's last writes
    assert r["host_check"]["widths_device_fnv"] == guest_result(r, "widths_in_line")["shadow_fnv"]
    dev = r["kvcxl_device"]
    assert dev["mem_requests"] > 10000  # the trapped pages still reach the device
    assert dev["migrations_to_nvme"] > 100 and dev["nvme_fills"] > 0
    # pages were mapped as guest RAM when their moves began, and each move waited
    assert dev["alias"]["on"] and dev["alias"]["pages_mapped"] > 0
    assert dev["unmaps_awaited"] > 100


def test_no_page_is_mapped_as_guest_ram_outside_dram(alias_boot) -> None:
    dev = alias_boot["kvcxl_device"]
    assert dev["alias_checks"] > 100  # every move out of DRAM, and every 5 ms
    assert dev["alias_violations"] == 0


def test_direct_pages_are_reached_as_guest_ram(alias_boot) -> None:
    """The bench job's copies (40 of 4 MiB each way, and 8-byte loads) over the device's
    last block went through the guest-RAM mapping: the device served no CXL.mem request
    there and QEMU completed no access there, while the block's pages were mapped.  In the
    same boot the trapped widths pages did reach the device, so the counts are live.  (The
    speed this buys is ``kvcxl bench --only qemu_boot_kvcxl_alias``'s figure.)"""
    bench = guest_result(alias_boot, "bench")
    areas = alias_boot["kvcxl_device"]["areas"]
    block = areas["bench_block"]
    assert block["bytes"] == bench["memcpy_block_bytes"]
    assert block["pages_mapped"] == block["pages"], block
    assert block["trapped_requests"] == 0 and block["direct_accesses"] == 0, block
    assert areas["widths"]["trapped_requests"] > 0, areas["widths"]


def test_sampled_first_touches_learn_the_replays_reads(patched_host) -> None:
    """``--sample-rate 1``: each step every DIRECT KV page is trapped until its first
    touch, so the reads the device learns equal the reads the replay reported, every
    step, though the pages are mapped as guest RAM the rest of the time."""
    from kvcxl.qemu.boot import BootOptions, boot, failure_summary

    # At rate 1 every DIRECT page traps until its first touch at each step, and with managed
    # tiers each step boundary's sinks wait for their alias unmaps: the replay ran 147 s on a
    # loaded 2-core machine (Measured).  It prints its progress every 10 s, so the default
    # stall watchdog holds; the timeout bounds the run on a loaded machine.
    r, _b = boot(
        BootOptions(qemu="kvcxl", jobs=("replay",), plugin=False, alias=True, sample_rate=1.0,
                    timeout=900)
    )  # fmt: skip
    rep = guest_result(r, "replay")
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    assert rep["bad_bytes"] == 0
    (session,) = r["firmware"]["sessions"]
    kt = session["device"]["kv_traffic"]
    assert kt["steps"] > 0 and kt["entries_read"] == kt["entries_expected"] > 0
    assert kt["disagreeing_steps"] == 0, kt["first_disagreement"]
    assert kt["sampling"]["rate"] == 1.0 and kt["sampling"]["error"] == 0.0
    assert r["kvcxl_device"]["alias"]["pages_mapped"] > 0
    assert r["kvcxl_device"]["alias_violations"] == 0
