"""A guest job that returned nothing fails with what the guest said (no QEMU here: the
reports are made by hand as a boot makes them; tests/test_qemu_boot.py does it on a real
guest whose firmware service is killed mid-replay)."""

from __future__ import annotations

import pytest

from kvcxl.qemu.boot import (
    FAILURE_EVENTS,
    NoGuestResult,
    failure_summary,
    guest_result,
    job_event,
    why_no_result,
)

CONSOLE = [f"[   {i}.000000] kernel line {i}" for i in range(37)] + [
    '@kvcxl {"event":"device_error","reason":"no heartbeat for 30012 ms (the budget: 30000 ms)"}',
    '@kvcxl {"event":"agent_failed","uptime":61.2,"job":"replay"}',
    '@kvcxl {"event":"poweroff","uptime":61.3}',
]


def _report(**guest: dict) -> dict:
    events = [
        {"event": "agent_start", "job": "replay", "t": 20.5},
        {"event": "device_error", "t": 61.0,
         "reason": "no heartbeat for 30012 ms (the budget: 30000 ms)", "pending": 812},
        {"event": "agent_failed", "job": "replay", "uptime": 61.2, "t": 61.1},
        {"event": "poweroff", "uptime": 61.3, "t": 61.2},
    ]  # fmt: skip
    return {
        "qemu": {"exit_code": 0},
        "jobs": ["replay"],
        "guest": {"device_error": events[1], **guest},
        "missing_results": [] if guest else ["replay"],
        "guest_failures": [e for e in events if e["event"] in FAILURE_EVENTS],
        "events": events,
        "device_log_tail": ["Traceback (most recent call last):", "MemoryError"],
        "console_tail": CONSOLE,
    }


def test_a_missing_result_fails_with_the_guests_error_and_its_console() -> None:
    r = _report()
    with pytest.raises(NoGuestResult) as exc:
        guest_result(r, "replay")
    msg = str(exc.value)
    assert msg.startswith("the guest returned no 'replay' result")
    assert "the agent started it" in msg
    # the guest's own words, before anything else
    said = next(ln for ln in msg.splitlines() if ln.startswith("the guest said: "))
    assert "device_error at 61.0 s" in said and "(the budget: 30000 ms)" in said
    assert "agent_failed at 61.1 s" in said and '"job": "replay"' in said
    assert "QEMU exit code 0" in msg
    assert "  MemoryError" in msg  # the device's log
    # and the console's last lines, every one of them
    assert all(f"  {ln}" in msg.splitlines() for ln in CONSOLE)
    assert isinstance(exc.value, AssertionError)  # a test that asked fails, not errors


def test_a_result_is_returned_as_the_guest_sent_it() -> None:
    replay = {"event": "replay", "bad_bytes": 0}
    assert guest_result(_report(replay=replay), "replay") is replay


def test_init_jobs_name_their_events() -> None:
    poison = {"event": "poison_list", "entries": ""}
    assert job_event("poison") == "poison_list" and job_event("replay") == "replay"
    assert guest_result(_report(poison_list=poison), "poison") is poison


def test_a_job_never_started_says_so_and_what_the_host_saw() -> None:
    r = _report()
    r["events"] = [{"event": "init", "t": 9.0}, {"event": "host_stall", "silent_s": 120.2,
                                                 "t": 140.0}]  # fmt: skip
    r["qemu"]["exit_code"] = -9
    msg = why_no_result(r, "replay")
    assert "the agent never started it" in msg
    assert "the guest said: nothing about a failure" in msg
    assert 'host_stall at 140.0 s: {"silent_s": 120.2}' in msg and "QEMU exit code -9" in msg


def test_failure_summary_names_the_missing_results() -> None:
    s = failure_summary(_report())
    assert s["missing_results"] == ["replay"] and s["device_log_tail"][-1] == "MemoryError"
