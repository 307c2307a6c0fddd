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
# serial run does (two guests at once on two cores would slow both past their timeouts).
_GUEST_FILES = ("test_qemu_",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist's ``--dist loadgroup`` (``make test``): a file's tests run on one worker,
    so that its module fixtures (a boot, a compiled design, a replay) are built once, and
    the guest files share one worker between them."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        path = item.nodeid.split("::", 1)[0]
        group = "qemu" if path.rsplit("/", 1)[-1].startswith(_GUEST_FILES) else path
        item.add_marker(pytest.mark.xdist_group(group))


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
