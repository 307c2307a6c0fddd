"""QMP fault injection into the emulated Type-3 device (``qemu.qmp``'s synchronous client).

``cxl-inject-poison`` adds a range to the device's poison list (the guest reads it
with ``trigger_poison_list``); ``cxl-inject-general-media-event`` puts a General Media
event record into an event log and raises the event interrupt (the guest's cxl
driver traces it as ``cxl_general_media``).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

DEVICE_PATH = "/machine/peripheral/cxl-vmem0"
MEMDEV_PATH = "/objects/cxl-mem1"
_REPO = str(Path(__file__).resolve().parent.parent)


def _legacy() -> Any:
    """``qemu.qmp.legacy``, even when this repository's root (with its qemu/ folder) is on
    sys.path, which would shadow the ``qemu`` namespace package of qemu.qmp."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _REPO]
    shadow = sys.modules.get("qemu")
    if shadow is not None and not hasattr(shadow, "__path__"):
        del sys.modules["qemu"]
    elif shadow is not None and any(
        os.path.abspath(p) == os.path.join(_REPO, "qemu") for p in shadow.__path__
    ):
        del sys.modules["qemu"]
    try:
        return importlib.import_module("qemu.qmp.legacy")
    except ModuleNotFoundError:
        # A ModuleNotFoundError naming the package: `kvcxl` names the extra that installs it.
        raise ModuleNotFoundError(
            "qemu.qmp is not installed: pip install 'kvcxl[host]' (qemu.qmp==0.0.6)",
            name="qemu.qmp",
        ) from None
    finally:
        sys.path[:] = saved


class Qmp:
    """One connection to a running QEMU's QMP socket."""

    def __init__(self, socket_path: str | Path, timeout: float = 10.0) -> None:
        legacy = _legacy()
        if not Path(socket_path).exists():
            raise FileNotFoundError(f"no QMP socket at {socket_path} (is the virtual host up?)")
        self.qmp = legacy.QEMUMonitorProtocol(str(socket_path))
        self.qmp.connect()
        self.timeout = timeout

    def cmd(self, name: str, **args: Any) -> Any:
        return self.qmp.cmd(name, **args)

    def close(self) -> None:
        self.qmp.close()

    def __enter__(self) -> Qmp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def device_bytes(self) -> int:
        """Size of the device's volatile memory (QEMU does not check injected ranges)."""
        return int(self.cmd("qom-get", path=MEMDEV_PATH, property="size"))

    def inject_poison(self, dpa: int, length: int = 64, path: str = DEVICE_PATH) -> Any:
        check_range(dpa, length)
        size = self.device_bytes()
        if dpa + length > size:
            raise ValueError(f"poison 0x{dpa:x}+{length} is beyond the device's {size >> 20} MiB")
        return self.cmd("cxl-inject-poison", path=path, start=dpa, length=length)

    def inject_media_event(
        self,
        dpa: int,
        *,
        log: str = "failure",
        descriptor: int = 0x1,
        type_: int = 0x0,
        transaction: int = 0x1,
        path: str = DEVICE_PATH,
    ) -> Any:
        """General Media event: ``descriptor`` bit 0 uncorrectable, ``type_`` 0 ECC error,
        ``transaction`` 1 host read (CXL 3.x table 8-45)."""
        if dpa % 64:
            raise ValueError(f"dpa 0x{dpa:x} is not 64-byte aligned")
        return self.cmd(
            "cxl-inject-general-media-event",
            path=path,
            log=log,
            flags=1,
            dpa=dpa,
            descriptor=descriptor,
            type=type_,
            **{"transaction-type": transaction},
        )


def check_range(dpa: int, length: int) -> None:
    if dpa < 0 or dpa % 64:
        raise ValueError(f"poison dpa 0x{dpa:x} must be >= 0 and 64-byte aligned")
    if length <= 0 or length % 64:
        raise ValueError(f"poison length {length} must be a positive multiple of 64")
