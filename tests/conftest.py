"""Fixtures shared by more than one test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def patched_host():
    """This machine's QEMU host with the patched QEMU (`kvcxl setup` builds it once, then it
    is cached); a setup that did not build it fails the test that asks."""
    from kvcxl.qemu.setup import setup

    h = setup(force=False)
    assert h.qemu_kvcxl, "setup did not build the patched QEMU"
    return h


# Files whose tests boot QEMU guests: one worker runs them all, one guest at a time, as a
# serial run did (their timeouts were set with one guest running).
_GUEST_FILES = ("test_qemu_",)
# Files whose tests share nothing built once and each take minutes (a bounded proof runs
# its own solver): each test is a unit, so the proofs spread over the workers.
_SPREAD_FILES = ("test_rtl_formal.py",)


def _work_unit(nodeid: str) -> str:
    """The scheduling unit of a test under ``make test``'s ``-n N --dist loadfile``: its
    file (its module fixtures, a boot, a compiled design, a replay, are built once), one
    unit for every guest file, and each test of a file of independent proofs."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if name.startswith(_GUEST_FILES):
        return "qemu guests"
    return nodeid if name in _SPREAD_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's loadfile scheduling, by :func:`_work_unit` (the ``xdist_group`` mark cannot
    do it: xdist 3.8 writes the group into a node id that pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ByUnit(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    """Whether the KVM boots can run here, at the top of every run's output (CI's log)."""
    from kvcxl.qemu.accel import kvm_unusable

    why = kvm_unusable()
    return "kvm: usable" if why is None else f"kvm: not usable here ({why}): KVM tests skip"


@pytest.fixture(scope="session")
def kvm_host(patched_host):
    """The patched host when its QEMU can run a guest under KVM here; otherwise the test
    is skipped with the reason, which ``-ra`` prints in the run's summary."""
    from kvcxl.qemu.accel import accel_unusable

    why = accel_unusable("kvm", str(patched_host.qemu_kvcxl))
    if why is not None:
        pytest.skip(f"KVM unavailable: {why}")
    return patched_host
