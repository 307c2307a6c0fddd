"""``kvcxl qemu boot --accel kvm``: the checks that say why KVM cannot run here, and a
KVM internal error ending the boot at once with the reason (fast, no QEMU); the boots
under KVM are in tests/test_qemu_alias.py (``alias_boot[kvm]``) and below (``slow``)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from kvcxl.qemu import accel


def test_a_missing_kvm_device_is_named() -> None:
    why = accel.kvm_unusable("/nonexistent/kvm")
    assert why is not None and "/nonexistent/kvm does not exist" in why


def test_a_device_that_is_not_kvm_is_named() -> None:
    # /dev/null opens read-write but answers no KVM ioctl
    why = accel.kvm_unusable("/dev/null")
    assert why is not None and "KVM_GET_API_VERSION" in why


def test_pvm_without_hardware_virtualisation_is_named(tmp_path: Path) -> None:
    """A /dev/kvm that answers like KVM (/dev/kvm itself when it exists, else skipped) but
    whose module is PVM alone is refused with that reason; beside kvm_intel it is not."""
    if accel.kvm_unusable(modules=str(tmp_path)) is not None:  # no modules dir: no PVM check
        pytest.skip(f"no KVM device to ask here: {accel.kvm_unusable(modules=str(tmp_path))}")
    (tmp_path / "kvm_pvm").mkdir()
    why = accel.kvm_unusable(modules=str(tmp_path))
    assert why is not None and "is PVM" in why and "internal error" in why
    (tmp_path / "kvm_intel").mkdir()
    assert accel.kvm_unusable(modules=str(tmp_path)) is None


def _fake_qemu(tmp_path: Path, accels: str) -> str:
    """A QEMU that answers ``-accel help`` with ``accels`` (one path per answer: cached)."""
    exe = tmp_path / f"qemu-{accels.replace(chr(92), '-')}"
    exe.write_text(f"#!/bin/sh\nprintf 'Accelerators supported in QEMU binary:\\n{accels}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_a_qemu_built_without_kvm_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(accel, "kvm_unusable", lambda dev=accel.KVM_DEV: None)
    exe = _fake_qemu(tmp_path, "tcg\\n")
    why = accel.accel_unusable("kvm", exe)
    assert why is not None and "built without kvm" in why and "kvcxl qemu setup" in why
    assert accel.accel_unusable("tcg", exe) is None
    assert accel.accel_unusable("kvm", _fake_qemu(tmp_path, "tcg\\nkvm\\n")) is None
    assert "choose one of tcg, kvm" in accel.accel_unusable("hvf", exe)
    assert "cannot ask" in accel.accel_unusable("tcg", str(tmp_path / "no-such-qemu"))


def test_kvm_unusable_reason_reaches_accel_unusable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(accel, "kvm_unusable", lambda dev=accel.KVM_DEV: "no KVM, planted")
    why = accel.accel_unusable("kvm", _fake_qemu(tmp_path, "tcg\\nkvm\\n"))
    assert why == "--accel kvm: no KVM, planted"


def test_a_kvm_internal_error_ends_the_boot_with_the_reason(tmp_path: Path) -> None:
    """QEMU stops the VM on a KVM internal error and would wait for ever: the console
    reader notes it, the wait ends the boot within a few seconds, the report and
    ``boot_ok`` say it failed and why."""
    from kvcxl.cli.qemu import boot_ok
    from kvcxl.qemu.boot import Boot, BootOptions, failure_summary

    lines = [
        b'@kvcxl {"event":"init","uptime":1.0}\n',
        b"KVM internal error. Suberror: 1\n",
        b"extra data[0]: 0x0000000000000001\n",
        b"emulation failure\n",
        b"RAX=0000000001ad2b90 RBX=0000000004794b64\n",
    ]

    class Stopped:
        """A QEMU whose VM stopped: it never exits until asked to quit."""

        stdout = iter(lines)
        quit = False

        def wait(self, timeout: float) -> int:
            if self.quit:
                return 0
            time.sleep(min(timeout, 0.05))
            import subprocess

            raise subprocess.TimeoutExpired("qemu", timeout)

    b = Boot(BootOptions(stall_s=5))
    b.qemu, b.workdir, b.t0 = Stopped(), tmp_path, time.monotonic()
    b._quit_qemu = lambda: setattr(b.qemu, "quit", True)  # type: ignore[method-assign]
    import threading

    b._reader = threading.Thread(target=b._read_console)
    b._reader.start()
    assert b._wait() == 0
    # it ended on the error, not on the stall watchdog (no host_stall)
    assert [e["event"] for e in b.events] == ["init", "kvm_internal_error"]
    assert b.events[1]["line"] == "KVM internal error. Suberror: 1"
    report = {
        "qemu": {"exit_code": 0},
        "guest_failures": [],
        "events": b.events,
        "kvm_internal_error": {"t": 1.0, "qemu_said": lines[1:3], "last_guest_event": "init"},
    }
    assert not boot_ok(report)
    assert "kvm_internal_error" in failure_summary(report)


@pytest.mark.slow
@pytest.mark.qemu
def test_the_patched_build_has_kvm(patched_host) -> None:
    """Setup's build passes --enable-kvm: the binary lists kvm beside tcg (wherever it was
    built; whether this machine can run it is kvm_unusable's question)."""
    assert {"tcg", "kvm"} <= accel.qemu_accels(str(patched_host.qemu_kvcxl))
