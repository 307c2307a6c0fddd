"""Guest loads and stores of every width through the patched QEMU's forwarding path.

One boot (about 1 min): the agent's ``widths`` jobs make 40,000 loads and stores each of
1, 2, 4, 8, 16 and 64 bytes at random offsets of a 64 KiB area whose first four pages the
device keeps trapped (every access a CXL.mem request) and whose last eight it moves to
NVMe and back without pause (``--churn``); the pages between are direct.  Every load is
compared with the guest's shadow copy, and the device's bytes at the end with the shadow's
hash.  ``widths`` also crosses 64-byte lines and pages; ``widths_in_line`` keeps each
access inside its line (the unit of a CXL.mem request)."""

from __future__ import annotations

import pytest

from kvcxl.cxl import ring as L
from kvcxl.qemu.boot import guest_result

pytestmark = [pytest.mark.slow, pytest.mark.qemu]

TRAP = ((L.WIDTHS_BASE, 16 << 10),)
CHURN = ((L.WIDTHS_BASE + (32 << 10), 32 << 10),)


@pytest.fixture(scope="module")
def widths_boot():
    from kvcxl.qemu.boot import BootOptions, boot, failure_summary

    r, _b = boot(
        BootOptions(qemu="kvcxl", jobs=("widths", "widths_in_line"), plugin=False,
                    trap=TRAP, churn=CHURN, timeout=900)
    )  # fmt: skip
    guest_result(r, "widths_in_line")  # else: fails with what the guest said
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    return r


def test_accesses_inside_a_line_are_right_on_trapped_direct_and_moving_pages(widths_boot):
    r = widths_boot
    w = guest_result(r, "widths_in_line")
    assert w["ops"] == 40000 and min(w[f"w{n}"] for n in (1, 2, 4, 8, 16, 64)) > 5000
    assert w["bad_bytes"] == 0, [e for e in r["events"] if e["event"] == "widths_bad"]
    # the device's bytes (whichever tier) are the guest's last writes
    assert r["host_check"]["widths_device_fnv"] == w["shadow_fnv"]
    dev = r["kvcxl_device"]
    assert dev["mem_requests"] > 10000 and dev["direct_accesses"] > 10000
    assert dev["migrations_to_nvme"] > 100 and dev["nvme_fills"] > 0


def test_accesses_across_lines_and_pages_are_right(widths_boot):
    """(Planted, before the patch's fix: 8-byte writes enabling the rest of their line and
    line-crossing accesses served from one line gave thousands of wrong bytes.)"""
    w = guest_result(widths_boot, "widths")
    assert w["straddling"] > 5000
    assert w["bad_bytes"] == 0, [e for e in widths_boot["events"] if e["event"] == "widths_bad"]
