"""The patched QEMU: guest accesses to the device's memory served by the kvcxl device.

The boots are slow (TCG); the packing test compiles the patch's own packing code
against the generated header and compares its bytes with the CXL.mem table's encoder."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.qemu.boot import guest_result
from kvcxl.qemu.qemu_patch import PATCH, render_header

TRAP = ((L.XFER_H2G, L.XFER_BYTES), (L.XFER_G2H, L.XFER_BYTES))
TRAPPED_ENTRIES = range(8, 12)  # KV entries every access to which is a CXL.mem request
HEALTH = (("life_used", 7), ("temperature", 41))
POISON_ENTRY = 5  # poisoned in the device before the guest probes (over its socket)
QMP_POISON_ENTRY = 20  # poisoned over QMP while the guest waits


def _patch_function(name: str) -> str:
    """One C function of the patch's new file, as the patch adds it."""
    added = [ln[1:] for ln in PATCH.read_text().splitlines() if ln.startswith("+")]
    text = "\n".join(added)
    m = re.search(rf"^static \w+ {name}\(.*?^\}}$", text, re.S | re.M)
    assert m, f"{name} not in the patch"
    return m.group(0)


def test_the_patch_packs_cxl_mem_messages_as_the_table(tmp_path) -> None:
    """MemRd and MemWrPtl built by the patch's kvcxl_put with the generated header are
    byte for byte what kvcxl.cxl.mem.encode makes of the same messages."""
    (tmp_path / "cxl_type3_kvcxl.h").write_text(render_header())
    prog = tmp_path / "pack.c"
    prog.write_text(
        "#include <stdio.h>\n#include <stdint.h>\n#include <string.h>\n"
        '#include "cxl_type3_kvcxl.h"\n'
        + _patch_function("kvcxl_put")
        + """
static void dump(const uint8_t *b, unsigned n) {
    for (unsigned i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\\n");
}
int main(void) {
    uint8_t rd[KVCXL_M2S_REQ_WIRE] = { KVCXL_M2S_REQ_CODE };
    kvcxl_put(rd + 1, KVCXL_M2S_REQ_OPCODE_LSB, KVCXL_M2S_REQ_OPCODE_W, KVCXL_MEM_RD);
    kvcxl_put(rd + 1, KVCXL_M2S_REQ_META_FIELD_LSB, KVCXL_M2S_REQ_META_FIELD_W, KVCXL_META_NO_OP);
    kvcxl_put(rd + 1, KVCXL_M2S_REQ_TAG_LSB, KVCXL_M2S_REQ_TAG_W, 0xBEEF);
    kvcxl_put(rd + 1, KVCXL_M2S_REQ_ADDR_LSB, KVCXL_M2S_REQ_ADDR_W, 0x2ABCDEF12345ULL);
    dump(rd, sizeof(rd));
    uint8_t wr[KVCXL_M2S_RWD_WIRE] = { KVCXL_M2S_RWD_CODE };
    uint64_t v = 0x1122334455667788ULL;
    kvcxl_put(wr + 1, KVCXL_M2S_RWD_OPCODE_LSB, KVCXL_M2S_RWD_OPCODE_W, KVCXL_MEM_WR_PTL);
    kvcxl_put(wr + 1, KVCXL_M2S_RWD_META_FIELD_LSB, KVCXL_M2S_RWD_META_FIELD_W, KVCXL_META_NO_OP);
    kvcxl_put(wr + 1, KVCXL_M2S_RWD_TAG_LSB, KVCXL_M2S_RWD_TAG_W, 7);
    kvcxl_put(wr + 1, KVCXL_M2S_RWD_ADDR_LSB, KVCXL_M2S_RWD_ADDR_W, 0x1234);
    kvcxl_put(wr + 1, KVCXL_M2S_RWD_BYTE_ENABLE_LSB, KVCXL_M2S_RWD_BYTE_ENABLE_W, 0xFFULL << 24);
    memcpy(wr + 1 + KVCXL_M2S_RWD_DATA_LSB / 8 + 24, &v, 8);
    dump(wr, sizeof(wr));
    return 0;
}
"""
    )
    exe = tmp_path / "pack"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(prog), f"-I{tmp_path}"], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    rd = mem.M2SReq(
        opcode=mem.M2SReqOpcode.MEM_RD, snp_type=mem.SnpType.NO_OP,
        meta_field=mem.MetaField.NO_OP, meta_value=0, tag=0xBEEF, addr=0x2ABCDEF12345,
    )  # fmt: skip
    line = bytearray(64)
    line[24:32] = (0x1122334455667788).to_bytes(8, "little")
    wr = mem.M2SRwD(
        opcode=mem.M2SRwDOpcode.MEM_WR_PTL, snp_type=mem.SnpType.NO_OP,
        meta_field=mem.MetaField.NO_OP, meta_value=0, tag=7, addr=0x1234, poison=0,
        byte_enable=0xFF << 24, data=bytes(line),
    )  # fmt: skip
    assert got == [mem.encode(rd).hex(), mem.encode(wr).hex()]


def test_the_forwarded_commands_are_the_command_tables_column() -> None:
    """The header's forwarded list is the rows of the command table marked forwarded, in
    opcode order; the commands the patch's code names are among them, and the
    "forwarded to the kvcxl device" cell of docs/qemu.md names exactly those rows."""
    from pathlib import Path

    from kvcxl.cxl import mailbox as mb

    rows = [c.opcode.name for _, c in sorted(mb.COMMANDS.items()) if c.forwarded]
    m = re.search(r"^#define KVCXL_CCI_FORWARDED\(X\) (.*)$", render_header(), re.M)
    assert m and re.findall(r"X\((\w+)\)", m.group(1)) == rows
    named = set(re.findall(r"KVCXL_CCI_(\w+?)_(?:SET|CMD|IN|EFFECT)\b", PATCH.read_text()))
    assert named and named <= set(rows), f"the patch uses {sorted(named - set(rows))}"
    doc = (Path(__file__).resolve().parent.parent / "docs" / "qemu.md").read_text()
    head = "| forwarded to the kvcxl device | stays QEMU's, and why |\n|---|---|\n"
    cell = doc[doc.index(head) + len(head) :].split(" | ", 1)[0]
    in_doc = [c.opcode.name for _, c in sorted(mb.COMMANDS.items()) if c.name in cell]
    assert in_doc == rows, f"docs/qemu.md forwards {in_doc}, the command table {rows}"


@pytest.fixture(scope="module")
def kvcxl_boot(patched_host):
    """Datapath, poison and replay with the kvcxl device on the memory path; the transfer
    buffers and four KV entries trapped, so every guest access to them is a CXL.mem
    request; health values and a poisoned line set in the device before the guest
    probes, a second line poisoned over QMP (`kvcxl qemu inject`) while it waits, and
    the device's clock read when the region is ready."""
    import sys

    from kvcxl.cxl import mailbox as mb
    from kvcxl.emu.device.service import Client
    from kvcxl.qemu.boot import BootOptions, boot
    from kvcxl.qemu.trace_image import default_trace

    gt = default_trace(steps=16)
    eb = gt.entry_bytes
    poison = L.KV_BASE + POISON_ENTRY * eb
    trapped = (L.KV_BASE + TRAPPED_ENTRIES[0] * eb, len(TRAPPED_ENTRIES) * eb)
    seen: dict = {}

    def hook(ev: dict, b) -> None:
        if ev.get("event") == "region_ready":  # Linux set the time at probe: the device's?
            with Client(b.device_socket, timeout=10) as c:
                rsp = c.cci(mb.Opcode.GET_TIMESTAMP)
            seen["timestamp"] = (rsp.rc, int.from_bytes(rsp.payload, "little"), time.time_ns())
        if ev.get("event") == "waiting" and "inject" not in seen:
            cmd = [sys.executable, "-m", "kvcxl.cli.main", "qemu", "inject", "poison"]
            cmd += ["--qmp", str(b.qmp_socket), "--dpa", hex(L.KV_BASE + QMP_POISON_ENTRY * eb)]
            seen["inject"] = subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    opts = BootOptions(
        qemu="kvcxl", jobs=("wait", "poison", "datapath", "replay"), wait_s=10, trace=gt,
        plugin=False, trap=(*TRAP, trapped), health=HEALTH, poison=((poison, 64),),
        on_event=hook, timeout=900,
    )  # fmt: skip
    report, b = boot(opts)
    return report, b, gt, seen


@pytest.mark.slow
@pytest.mark.qemu
def test_region_ready_on_the_patched_qemu(kvcxl_boot) -> None:
    from kvcxl.qemu.boot import failure_summary

    r, _b, _gt, _seen = kvcxl_boot
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    assert "kvcxl=" in r["qemu"]["command"] and r["qemu"]["command"].startswith(
        str(_b.host.qemu_kvcxl)
    )
    assert r["region"]["size"] == hex(256 << 20)
    memdevs = [m for part in r["cxl_list"] for m in part.get("memdevs", [])]
    assert memdevs and memdevs[0]["ram_size"] == 256 << 20


@pytest.mark.slow
@pytest.mark.qemu
def test_trapped_pages_go_through_the_device_and_read_back_right(kvcxl_boot) -> None:
    r, _b, _gt, _seen = kvcxl_boot
    dp = guest_result(r, "datapath")
    assert dp["host_to_guest_bytes"] == L.XFER_BYTES and dp["host_to_guest_bad"] == 0
    assert r["host_check"]["guest_to_host_bad_bytes"] == 0
    assert r["host_check"]["kv_bad_bytes"] == 0
    dev = r["kvcxl_device"]
    # Every byte of both buffers reached the device (TCG loads and stores ≤ 8 bytes).
    assert dev["reads"] >= L.XFER_BYTES // 8 and dev["writes"] >= L.XFER_BYTES // 8
    assert dev["mem_requests"] == dev["reads"] + dev["writes"]
    # The rest of the guest's traffic (the ring, the KV cache) went direct, and was counted.
    assert dev["direct_accesses"] > 100_000


@pytest.mark.slow
@pytest.mark.qemu
def test_replay_victims_equal_the_simulators(kvcxl_boot) -> None:
    from kvcxl.qemu.trace_image import simulate_victims

    r, b, gt, _seen = kvcxl_boot
    rep = guest_result(r, "replay")
    assert rep["bad_bytes"] == 0 and rep["residency_mismatches"] == 0
    want = simulate_victims(gt)
    assert b.victims[0] == want and rep["victim_hash"] == L.fnv1a_ids(want)


@pytest.mark.slow
@pytest.mark.qemu
def test_a_dead_device_fails_accesses_in_bounded_time_and_nothing_hangs(patched_host) -> None:
    from kvcxl.qemu.boot import BootOptions, boot

    def hook(ev: dict, b) -> None:
        if ev.get("event") == "waiting":
            b.kill_device()

    r, b = boot(
        BootOptions(
            qemu="kvcxl",
            jobs=("wait", "datapath"),
            wait_s=2,
            plugin=False,
            trap=TRAP,
            on_event=hook,
            timeout=600,
        )
    )
    assert any(e["event"] == "host_killed_device" for e in r["events"])
    # The guest read the trapped buffer and saw the failure as wrong bytes, reported them
    # and powered off; QEMU said why and exited by itself, before the host's timeout or
    # stall watchdog had to stop anything.
    assert guest_result(r, "datapath")["host_to_guest_bad"] > 0
    assert any("kvcxl: device link" in line for line in b.console)
    assert r["qemu"]["exit_code"] == 0
    names = {e["event"] for e in r["events"]}
    assert "poweroff" in names and not names & {"host_timeout", "host_stall"}, names
    assert b.qemu.poll() is not None


@pytest.mark.slow
@pytest.mark.qemu
def test_a_qemu_crash_is_reported_with_its_backtrace(patched_host, tmp_path) -> None:
    """QEMU dies of SIGSEGV mid-run (sent to it here, as a crash would raise it): the
    report names the signal and carries gdb's backtraces from the core dump, so that a
    crash seen once (in CI, say) can be read from the failed check's message alone."""
    import os
    import signal

    from kvcxl.qemu.boot import BootOptions, boot, failure_summary

    def hook(ev: dict, b) -> None:
        if ev.get("event") == "waiting":
            os.kill(b.qemu.pid, signal.SIGSEGV)

    r, _b = boot(
        BootOptions(
            qemu="kvcxl", jobs=("wait",), wait_s=60, plugin=False, on_event=hook,
            workdir=str(tmp_path), keep=False, timeout=900,
        )
    )  # fmt: skip
    assert r["qemu"]["exit_code"] == -signal.SIGSEGV, failure_summary(r)
    crash = r["qemu_crash"]
    assert crash["signal"] == "SIGSEGV", crash
    bt = crash["backtrace"]
    assert bt is not None, crash  # its note says why not (no gdb, or no core dump)
    assert any(ln.startswith("Program terminated with signal SIGSEGV") for ln in bt), bt
    assert any(ln.startswith("#0 ") for ln in bt) and any("qemu_main" in ln for ln in bt), bt
    assert not list(tmp_path.glob("core*"))  # read, then removed: it holds the guest's RAM


@pytest.mark.slow
@pytest.mark.qemu
def test_the_guest_sees_the_devices_health(kvcxl_boot) -> None:
    """QEMU has no Get Health Info of its own: what `cxl list -H` shows is the device's."""
    r, _b, _gt, _seen = kvcxl_boot
    memdevs = [m for part in r["cxl_list"] for m in part.get("memdevs", [])]
    health = memdevs[0]["health"]
    assert health["life_used_percent"] == dict(HEALTH)["life_used"]
    assert health["temperature"] == dict(HEALTH)["temperature"]


@pytest.mark.slow
@pytest.mark.qemu
def test_poison_in_the_device_is_what_the_guest_lists(kvcxl_boot) -> None:
    r, _b, gt, _seen = kvcxl_boot
    dpa = L.KV_BASE + POISON_ENTRY * gt.entry_bytes
    # Get Poison List reached the device: its list is what the kernel traced.
    assert f"{dpa:#x}:0x40" in guest_result(r, "poison")["entries"]
    assert guest_result(r, "replay")["poisoned_entries"] == 2
    assert [hex(dpa), hex(64)] in r["firmware"]["poison_reports"]


@pytest.mark.slow
@pytest.mark.qemu
def test_qmp_poison_reaches_the_device(kvcxl_boot) -> None:
    """`kvcxl qemu inject poison --qmp` lands in the kvcxl device (the patched QEMU sends
    it Inject Poison): the guest's poison list is the device's and holds it."""
    r, _b, gt, seen = kvcxl_boot
    assert seen["inject"].returncode == 0, seen["inject"].stderr
    dpa = L.KV_BASE + QMP_POISON_ENTRY * gt.entry_bytes
    assert f"{dpa:#x}:0x40" in guest_result(r, "poison")["entries"]
    assert r["kvcxl_device"]["poisoned_lines"] == 2  # this one and the socket's
    assert [hex(dpa), hex(64)] in r["firmware"]["poison_reports"]


@pytest.mark.slow
@pytest.mark.qemu
def test_the_guests_set_timestamp_reaches_the_device(kvcxl_boot) -> None:
    """Linux sets the device's time at probe; Set Timestamp is forwarded, so the device's
    own Get Timestamp (asked over its socket) tells the host's time."""
    _r, _b, _gt, seen = kvcxl_boot
    rc, device_ns, host_ns = seen["timestamp"]
    assert rc == 0 and abs(device_ns - host_ns) < 60e9  # the guest clock under TCG drifts


@pytest.mark.slow
@pytest.mark.qemu
def test_one_device_answers_the_ring_on_its_doorbell(kvcxl_boot) -> None:
    """The ring's firmware is the memory-path device, and every command was served on its
    doorbell write (a trapped CXL.mem write), none found by polling."""
    r, _b, _gt, _seen = kvcxl_boot
    fw = r["firmware"]
    assert fw["firmware"] == "memory-path device" and fw["served_on"] == "doorbell"
    assert fw["doorbells"] == fw["doorbell_writes"] == sum(fw["commands"].values()) > 100
    assert fw["errors"] == 0


@pytest.mark.slow
@pytest.mark.qemu
def test_the_device_learns_the_replays_reads_from_the_traffic(kvcxl_boot) -> None:
    """At each step's end the device maps that step's per-page access counts (direct
    ones counted by QEMU, trapped ones by itself) to KV entries: every step they are
    the entries the replay had to read (misses and admissions, poisoned ones aside)."""
    r, _b, gt, _seen = kvcxl_boot
    kt = r["firmware"]["sessions"][0]["device"]["kv_traffic"]
    assert kt["steps"] == gt.stream.n_steps
    assert kt["disagreeing_steps"] == 0, kt["first_disagreement"]
    assert kt["entries_read"] == kt["entries_expected"] >= guest_result(r, "replay")["cxl_reads"]


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("alias", [False, True], ids=["mmio", "alias"])
def test_pages_moving_under_guest_load_lose_no_byte(patched_host, alias) -> None:
    """The device moves the transfer buffers' pages to NVMe and back without pause while
    the guest reads one and writes the other: direct accesses that overlap a move are
    redone through the device, accesses that find a page on NVMe are served from it.
    With ``alias`` the DRAM-tier pages are mapped into the guest as RAM meanwhile."""
    from kvcxl.qemu.boot import BootOptions, boot, failure_summary

    r, _b = boot(
        BootOptions(
            qemu="kvcxl",
            jobs=("datapath",),
            plugin=False,
            churn=TRAP,
            alias=alias,
            timeout=900,
        )
    )
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    dp = guest_result(r, "datapath")
    assert dp["host_to_guest_bytes"] == L.XFER_BYTES and dp["host_to_guest_bad"] == 0
    assert r["host_check"]["guest_to_host_bad_bytes"] == 0
    dev = r["kvcxl_device"]
    assert dev["migrations_to_nvme"] > 32 and dev["migrations_to_dram"] > 32  # >1 round
    assert dev["nvme_fills"] > 0  # the guest did meet pages on the NVMe tier
    assert dev["mem_requests"] > 0
    if alias:
        # DRAM-tier pages are guest RAM: their accesses reach no counter (an MMIO direct
        # access happens only when the guest touches a page between its move and its
        # mapping, which the timing may not produce). The mappings followed the moves:
        assert dev["alias"]["map_ack"] > 32 and dev["unmaps_awaited"] > 0
    else:
        assert dev["direct_accesses"] > 0
    assert dev["alias_violations"] == 0


@pytest.mark.slow
@pytest.mark.qemu
def test_blocks_placed_on_nvme_are_fetched_from_nvme(kvcxl_boot) -> None:
    """Each victim's KV block moves, in the memory-path device, to the tier the firmware
    decides — with managed tiers (the default) DRAM first, NVMe when a step boundary
    sinks it; the guest's later reads of NVMe-placed blocks are served from NVMe, right."""
    r, _b, gt, _seen = kvcxl_boot
    rep = guest_result(r, "replay")
    assert gt.entry_bytes == 4096  # one device page per entry
    placed = r["firmware"]["memory_path_pages_placed"]
    assert rep["victims_to_nvme"] == 0 and placed["dram"] == rep["victims"] > 0
    assert placed["nvme"] > 0  # the step boundaries' sinks
    dev = r["kvcxl_device"]
    # a guest read that finds its block on NVMe fetches the page into DRAM once
    assert dev["migrations_to_nvme"] > 0 and dev["nvme_fills"] > 0
    assert rep["bad_bytes"] == 0 and rep["residency_mismatches"] == 0


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.model
def test_a_real_smollm2_capture_replays_through_the_device(patched_host, tmp_path) -> None:
    """A captured SmolLM2 trace, replayed by the guest on the patched QEMU: the firmware's
    victims are the simulator's, every byte read back is right, and the blocks placed on
    NVMe are fetched from there."""
    import sys

    from kvcxl.qemu.boot import BootOptions, boot, failure_summary
    from kvcxl.qemu.trace_image import load_trace, simulate_victims

    cap = tmp_path / "chat.npz"
    cmd = [sys.executable, "-m", "kvcxl.cli.main", "trace", "capture", "--prompt", "chat"]
    subprocess.run([*cmd, "--steps", "8", "-o", str(cap)], check=True, timeout=600)
    gt = load_trace(cap, 0.25)
    r, b = boot(BootOptions(jobs=("replay",), trace=gt, plugin=False, timeout=900))
    rep = guest_result(r, "replay")  # else: fails with what the guest and the device said
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    want = simulate_victims(gt)
    assert len(want) > 1000
    assert b.victims[0] == want and rep["victim_hash"] == L.fnv1a_ids(want)
    assert rep["bad_bytes"] == 0 and rep["residency_mismatches"] == 0
    placed = r["firmware"]["memory_path_pages_placed"]  # managed tiers: victims land in DRAM
    assert rep["victims_to_nvme"] == 0 and placed["dram"] == rep["victims"]
    assert placed["nvme"] > 0 and r["kvcxl_device"]["nvme_fills"] > 0  # sunk, read back
