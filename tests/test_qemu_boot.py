"""Boots of the QEMU virtual host (slow: each is one to two minutes under TCG).

Every boot has a hard timeout in BootOptions and kills QEMU and the firmware service
on the way out, pass or fail."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from kvcxl.cxl import ring as L
from kvcxl.qemu.boot import NoGuestResult, guest_result

pytestmark = [pytest.mark.slow, pytest.mark.qemu]

POISON_ENTRY = 5


def _boot(opts):
    """boot(), saying so in the test output when a boot had to be retried."""
    from kvcxl.qemu.boot import boot

    report, b = boot(opts)
    for x in report["boot_retries"]:
        warnings.warn(f"boot retried: it failed before the kvcxl agent started ({x})", stacklevel=2)
    return report, b


def _where(r: dict) -> str:
    """What a failed boot's report says about where the guest stopped."""
    return json.dumps({k: r.get(k) for k in ("events", "console_tail", "boot_retries")})[-3000:]


@pytest.fixture(scope="module")
def host():
    from kvcxl.qemu.setup import SetupError, load_host, setup

    try:
        setup(force=False)
        return load_host()
    except SetupError as exc:  # not root / no Debian packages: say why
        pytest.skip(f"virtual host unavailable: {exc}")


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    from kvcxl.qemu.trace_image import default_trace

    path = tmp_path_factory.mktemp("trace") / "default.npz"
    default_trace(steps=16).stream.to_trace().save(path)
    return path


@pytest.fixture(scope="module")
def main_boot(host, trace_file):
    """One boot exercising region, data path, replay, poison, media event, malformed ring."""
    from kvcxl.qemu.boot import BootOptions
    from kvcxl.qemu.trace_image import load_trace

    gt = load_trace(trace_file, 0.25)
    poison_dpa = L.KV_BASE + POISON_ENTRY * gt.entry_bytes
    opts = BootOptions(
        qemu="stock",  # the stock path stays available when asked for
        jobs=("poison", "datapath", "replay", "malformed"),
        trace=gt,
        plugin=False,
        poison=((poison_dpa, 64),),
        media_events=(L.KV_BASE,),
        timeout=900,
    )
    t = time.monotonic()
    report, b = _boot(opts)
    report["_test_wall_s"] = time.monotonic() - t
    return report, b, gt


def test_region_ready_and_cxl_list_shows_memdev(main_boot) -> None:
    from kvcxl.qemu.boot import failure_summary

    r, _b, _gt = main_boot
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)
    assert r["qemu"]["plugin"] == "off" and r["qemu"]["plugin_note"]  # ring-only, said so
    assert r["timings"]["boot_to_init_s"] < r["timings"]["boot_to_region_ready_s"]
    assert r["region"]["size"] == hex(256 << 20)
    assert r["region"]["base"] == hex(L.WINDOW_BASE)
    memdevs = [m for part in r["cxl_list"] for m in part.get("memdevs", [])]
    assert memdevs and memdevs[0]["memdev"] == "mem0"
    assert memdevs[0]["ram_size"] == 256 << 20
    regions = [x for part in r["cxl_list"] for x in part.get("regions", [])]
    assert regions and regions[0]["decode_state"] == "commit"


def test_data_path_both_directions(main_boot) -> None:
    r, _b, _gt = main_boot
    dp = guest_result(r, "datapath")
    assert dp["host_to_guest_bytes"] == L.XFER_BYTES and dp["host_to_guest_bad"] == 0
    assert r["host_check"]["guest_to_host_bad_bytes"] == 0
    # The KV cache the guest laid out in /dev/dax0.0 is in the host's media file.
    assert r["host_check"]["kv_entries_checked"] > 10
    assert r["host_check"]["kv_bad_bytes"] == 0


def test_replay_matches_simulator_api_and_cli(main_boot, trace_file, tmp_path) -> None:
    from kvcxl.qemu.trace_image import simulate_victims

    r, b, gt = main_boot
    rep = guest_result(r, "replay")
    assert rep["bad_bytes"] == 0 and rep["residency_mismatches"] == 0 and rep["ring_errors"] == 0
    want = simulate_victims(gt)
    assert len(want) > 100
    assert b.victims[0] == want  # the firmware service's victims, in order
    assert rep["victim_hash"] == L.fnv1a_ids(want)  # what the guest agent received
    assert rep["victims"] == len(want)
    assert r["firmware"]["sessions"][0]["audit"]["wrong_victims"] == 0
    # The simulator's CLI on the same file and budget names the same victims.
    csv_path = tmp_path / "victims.csv"
    cmd = [sys.executable, "-m", "kvcxl.cli.main", "simulate", "--trace", str(trace_file)]
    cmd += ["--policy", "ema", "--budget", str(gt.budget_bytes()), "--dump-victims", str(csv_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, cwd="/")
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    s = gt.stream
    ours = [
        (int(s.e_ctx[e]), int(s.e_layer[e]), int(s.e_head[e]), int(s.e_block[e]))
        for e in b.victims[0]
    ]
    cli = [(int(x["context"]), int(x["layer"]), int(x["head"]), int(x["block"])) for x in rows]
    assert cli == ours


def test_injected_poison_seen_by_guest_and_firmware(main_boot) -> None:
    r, _b, gt = main_boot
    dpa = L.KV_BASE + POISON_ENTRY * gt.entry_bytes
    assert f"{dpa:#x}:0x40" in guest_result(r, "poison")["entries"]
    assert any("cxl_poison" in line for line in r["cxl_trace"])
    assert guest_result(r, "replay")["poisoned_entries"] == 1
    assert [hex(dpa), hex(64)] in r["firmware"]["poison_reports"]
    assert r["firmware"]["poisoned_entries"] == [POISON_ENTRY]


def test_media_event_traced_by_guest(main_boot) -> None:
    r, _b, _gt = main_boot
    assert any(e["event"] == "host_inject_media_event" for e in r["events"])
    assert any("cxl_general_media" in line for line in r["cxl_trace"]), r["cxl_trace"]


def test_malformed_ring_commands_get_error_completions(main_boot) -> None:
    r, _b, _gt = main_boot
    m = guest_result(r, "malformed")
    assert m["unknown_opcode"] == L.RC_UNSUPPORTED
    assert m["attn_before_open"] == L.RC_INVALID_INPUT
    assert m["open_too_big"] == L.RC_INVALID_INPUT
    assert m["count_too_large"] == L.RC_INVALID_PAYLOAD_LENGTH
    assert m["short_payload"] == L.RC_INVALID_PAYLOAD_LENGTH
    assert m["entry_out_of_range"] == L.RC_INVALID_INPUT
    assert m["nan_weight"] == L.RC_INVALID_INPUT
    assert m["open"] == m["create"] == m["nop_after"] == L.RC_SUCCESS


def test_cli_inject_then_service_killed_mid_run(host) -> None:
    """`kvcxl qemu inject` on a running guest; then the firmware service dies mid-replay:
    the agent reports a device error once its heartbeat budget has passed (bounded: the
    guest powers off by itself, before the host's timeout or stall watchdog)."""
    from kvcxl.qemu.boot import BootOptions, failure_summary

    dpa = L.KV_BASE + 3 * 4096
    injected: list[subprocess.CompletedProcess] = []

    def hook(ev: dict, b) -> None:
        if ev.get("event") == "waiting":  # the guest idles: inject through the CLI
            cmd = [sys.executable, "-m", "kvcxl.cli.main", "qemu", "inject", "poison"]
            cmd += ["--qmp", str(b.qmp_socket), "--dpa", hex(dpa)]
            injected.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60))
        if ev.get("event") == "agent_start" and ev.get("job") == "replay":
            b.kill_service()

    opts = BootOptions(
        qemu="stock",
        jobs=("wait", "poison", "replay"),
        wait_s=10,  # room for the CLI (a Python start-up) on a loaded machine
        plugin=False,
        device_emulator=False,
        on_event=hook,
        timeout=600,
    )
    r, b = _boot(opts)
    assert injected and injected[0].returncode == 0, injected and injected[0].stderr
    assert f"{dpa:#x}:0x40" in guest_result(r, "poison")["entries"]
    assert any(e["event"] == "host_killed_service" for e in r["events"])
    err = r["guest"].get("device_error")
    assert err is not None, r["guest_failures"]
    killed = next(e["t"] for e in r["events"] if e["event"] == "host_killed_service")
    # after the kill, and for the reason the agent's budget (BootOptions.heartbeat_s) names
    budget_ms = round(opts.heartbeat_s * 1000)
    assert err["t"] > killed and f"(the budget: {budget_ms} ms)" in err["reason"], err
    assert r["qemu"]["exit_code"] == 0, failure_summary(r)  # it powered off by itself
    names = {e["event"] for e in r["events"]}
    assert "poweroff" in names and not names & {"host_timeout", "host_stall"}, names
    assert "replay" not in r["guest"] and r["missing_results"] == ["replay"]
    # asked for, the missing result fails with the guest's own error and its console
    with pytest.raises(NoGuestResult) as no_replay:
        guest_result(r, "replay")
    said = str(no_replay.value)
    assert err["reason"] in said and r["console_tail"][-1] in said
    assert b.qemu.poll() is not None and b.service.poll() is not None


def test_plugin_streams_cxl_accesses(host) -> None:
    from kvcxl.qemu.boot import BootOptions

    if not host.plugin_available:
        pytest.skip(f"ring-only mode: {host.plugin_error}")
    r, _b = _boot(BootOptions(qemu="stock", jobs=("replay",), plugin=True, timeout=900))
    assert r["qemu"]["exit_code"] == 0 and r["qemu"]["plugin"] == "on"
    assert "tracing" in r["guest"], _where(r)
    assert r["guest"]["tracing"]["state"] == L.TRACING_ON  # armed before the job's accesses
    p = r["firmware"]["plugin"]
    assert p["reads"] > 0 and p["writes"] > 0 and p["outside_window"] == 0
    sess = r["firmware"]["sessions"][0]
    # Every entry the guest read from device memory was seen as CXL.mem reads.
    assert sess["plugin_entries_accessed"] == sess["entries"]
    assert guest_result(r, "replay")["bad_bytes"] == 0


def test_a_crashed_or_silent_guest_is_stopped_retried_and_reported(
    host, monkeypatch, capsys
) -> None:
    """Before the agent starts, a QEMU that ends on a signal (planted: SIGABRT as it starts,
    as QEMU's own assertions end it) and a guest silent for stall_s (1 s is shorter than the
    kernel's quiet boot) are both retried; the final boot stalls again and its report fails,
    saying where."""
    import kvcxl.qemu.boot as qb
    from kvcxl.cli.qemu import _summary, boot_ok

    aborted: list[int] = []

    class AbortFirst(qb.Boot):
        def _wait(self) -> int:
            if not aborted:
                aborted.append(self.qemu.pid)
                os.kill(self.qemu.pid, signal.SIGABRT)
            return super()._wait()

    monkeypatch.setattr(qb, "Boot", AbortFirst)
    r, b = qb.boot(
        qb.BootOptions(
            qemu="stock", jobs=("datapath",), plugin=False, device_emulator=False, stall_s=1.0,
            retries=2, timeout=600,
        )
    )  # fmt: skip
    crash, stall = r["boot_retries"]
    assert crash["why"] == "qemu_crash" and crash["signal"] == "SIGABRT", crash
    assert stall["why"] == "stall" and stall["silent_s"] >= 1.0, stall
    _summary(r)  # what `kvcxl qemu boot` prints of them
    said = capsys.readouterr().out
    assert "retried: QEMU ended on SIGABRT (at " in said, said
    assert "retried: the guest stalled (silent " in said, said
    # the watchdog stopped the last one, not the boot's timeout
    names = {e["event"] for e in r["events"]}
    assert "host_stall" in names and "host_timeout" not in names, names
    assert not boot_ok(r) and "console_tail" in r
    assert b.qemu.poll() is not None and b.service.poll() is not None
