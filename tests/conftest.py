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
