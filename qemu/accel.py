"""The guest's accelerator (``kvcxl qemu boot --accel tcg|kvm``): whether KVM is usable
here, and whether a QEMU binary was built with an accelerator.

KVM needs ``/dev/kvm`` that this process can open read-write and that answers the KVM
API version QEMU speaks (12, stable since Linux 2.6.22), backed by hardware virtualisation
(``kvm_intel`` or ``kvm_amd``), and a QEMU built with KVM (``qemu-system-x86_64 -accel
help`` lists it).  A ``/dev/kvm`` served by PVM alone (``kvm_pvm``, the pagetable-based
VM of sandboxes without VT-x/AMD-V) does not count: it runs an unmodified guest kernel's
supervisor code through its instruction emulator, and this project's Debian guest kernel
stops there with a KVM internal error (docs/qemu.md, "KVM").  Each check answers with the reason it
fails, so that ``--accel kvm`` and the tests that need KVM can say why it is not here.
"""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
from pathlib import Path

ACCELS = ("tcg", "kvm")
KVM_DEV = "/dev/kvm"
KVM_GET_API_VERSION = 0xAE00  # _IO(KVMIO, 0x00), linux/kvm.h
KVM_API_VERSION = 12
# The line QEMU prints when KVM cannot run or emulate a guest instruction (the VM stops)
KVM_INTERNAL_ERROR = "KVM internal error"


def kvm_unusable(dev: str = KVM_DEV, modules: str = "/sys/module") -> str | None:
    """Why KVM cannot run a guest here (None: it can); ``modules``: the loaded modules."""
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{dev} does not exist (no KVM module loaded, or no virtualisation here)"
    except PermissionError:
        return f"{dev} is not readable and writable by this user (uid {os.getuid()})"
    except OSError as exc:
        return f"{dev} cannot be opened: {exc.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return f"{dev} does not answer KVM_GET_API_VERSION: {exc.strerror}"
    finally:
        os.close(fd)
    if version != KVM_API_VERSION:
        return f"{dev} speaks KVM API version {version}, QEMU needs {KVM_API_VERSION}"
    mods = Path(modules)
    if (mods / "kvm_pvm").is_dir() and not any(
        (mods / m).is_dir() for m in ("kvm_intel", "kvm_amd")
    ):
        return (
            f"{dev} is PVM (module kvm_pvm; no kvm_intel or kvm_amd: no hardware "
            "virtualisation here), whose instruction emulator runs the guest kernel and "
            'stops on it with a KVM internal error (docs/qemu.md, "KVM")'
        )
    return None


@functools.cache
def qemu_accels(binary: str) -> frozenset[str]:
    """The accelerators ``binary`` was built with (``-accel help``)."""
    r = subprocess.run([binary, "-accel", "help"], capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    return frozenset(ln.strip() for ln in lines[1:] if ln.strip())


def accel_unusable(accel: str, binary: str) -> str | None:
    """Why ``binary`` cannot run a guest with ``accel`` here (None: it can)."""
    if accel not in ACCELS:
        return f"--accel {accel!r}: choose one of {', '.join(ACCELS)}"
    if accel == "kvm":
        why = kvm_unusable()
        if why is not None:
            return f"--accel kvm: {why}"
    try:
        have = qemu_accels(binary)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"--accel {accel}: cannot ask {binary} for its accelerators: {exc}"
    if accel not in have:
        return (
            f"--accel {accel}: {binary} was built without {accel} (it has "
            f"{', '.join(sorted(have)) or 'none'}); run `kvcxl qemu setup`"
        )
    return None
