"""The device's mailbox: command handlers behind the CCI message framing.

:meth:`Mailbox.execute` takes one encoded request (see :mod:`kvcxl.cxl.mailbox`
for the framing, opcodes and return codes) and always returns one encoded
response — for malformed input the spec's return code, never an exception.
A handler answers Invalid Input only for what the device refuses by name
(:class:`MailboxError`, :class:`~kvcxl.emu.device.errors.RequestError`,
:class:`~kvcxl.firmware.config.ConfigError`); any other exception is a bug, answered
Internal Error and counted in the device's ``internal_errors``.
Payload layouts follow CXL 2.0 §8.2.9 and match QEMU's ``hw/cxl`` and Linux's
``drivers/cxl`` structures; vendor commands are documented in docs/device.md.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable

import numpy as np

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl.mailbox import CciMessage, FramingError, Opcode
from kvcxl.cxl.mailbox import ReturnCode as RC
from kvcxl.firmware.config import ConfigError

from .device import RequestError, Type3Device
from .media import MediaError
from .poison import LIST_MAX as POISON_LIST_MAX


def _req(op: Opcode) -> struct.Struct:
    return mb.COMMANDS[op].request.fixed


def _rsp(op: Opcode) -> struct.Struct:
    return mb.COMMANDS[op].response.fixed


class MailboxError(Exception):
    """Raised inside a handler to answer with ``rc``."""

    def __init__(self, rc: RC, detail: str = "") -> None:
        super().__init__(detail)
        self.rc = rc


def _cel() -> bytes:
    return b"".join(
        struct.pack("<HH", c.opcode, c.effects)
        for c in sorted(mb.COMMANDS.values(), key=lambda c: c.opcode)
    )


class Mailbox:
    """The CCI of one :class:`Type3Device`."""

    def __init__(self, device: Type3Device) -> None:
        self.dev = device
        self.cel = _cel()
        self.last_error = ""
        # Dispatch comes from the command table: each row names its handler method.
        self.handlers: dict[int, Callable[[bytes], bytes]] = {
            op: getattr(self, c.handler) for op, c in mb.COMMANDS.items()
        }

    # --- dispatch ----------------------------------------------------------------------
    def execute(self, raw: bytes | bytearray | memoryview) -> bytes:
        """One encoded request in, one encoded response out."""
        tag = raw[1] if len(raw) > 1 else 0
        opcode = (raw[3] | raw[4] << 8) if len(raw) >= 5 else 0
        try:
            req = CciMessage.decode(raw)
            rc, out = self.call(req.opcode, req.payload, req.category)
        except FramingError as exc:
            rc, out = exc.rc, b""
            self.last_error = str(exc)
        return CciMessage(mb.CAT_RESPONSE, tag, opcode, out, rc=int(rc)).encode()

    def call(self, opcode: int, payload: bytes, category: int = mb.CAT_REQUEST) -> tuple[RC, bytes]:
        """Run one command; returns (return code, output payload)."""
        try:
            if category != mb.CAT_REQUEST:
                raise MailboxError(RC.INVALID_INPUT, f"category {category} is not a request")
            cmd = mb.COMMANDS.get(opcode)
            if cmd is None:
                raise MailboxError(RC.UNSUPPORTED, f"opcode {opcode:#06x} is not supported")
            if len(payload) > mb.PAYLOAD_MAX:
                raise MailboxError(
                    RC.INVALID_PAYLOAD_LENGTH, f"{len(payload)} B exceeds {mb.PAYLOAD_MAX} B"
                )
            if cmd.in_len is not None and len(payload) != cmd.in_len:
                raise MailboxError(
                    RC.INVALID_PAYLOAD_LENGTH,
                    f"{cmd.name} takes {cmd.in_len} B of input, got {len(payload)}",
                )
            out = self.handlers[opcode](bytes(payload))
            self.last_error = ""
            return RC.SUCCESS, out
        except MailboxError as exc:
            self.last_error = str(exc)
            return exc.rc, b""
        except MediaError as exc:  # a file-backed tier's disk refused: Media Disabled
            self.last_error = f"media error: {exc}"
            self.dev.counters["media_errors"] += 1
            return RC.MEDIA_DISABLED, b""
        except Exception as exc:  # a handler bug must not take the device down...
            self.last_error = f"internal error: {type(exc).__name__}: {exc}"
            self.dev.counters["internal_errors"] += 1  # ...nor go uncounted
            return RC.INTERNAL_ERROR, b""

    # --- generic commands ---------------------------------------------------------------
    def _identify(self, _: bytes) -> bytes:
        return _rsp(Opcode.IDENTIFY).pack(
            mb.PCI_VENDOR_ID,
            mb.PCI_DEVICE_ID,
            mb.PCI_VENDOR_ID,
            0,
            self.dev.serial,
            mb.PAYLOAD_MAX.bit_length() - 1,
            0x3,  # component type: Type-3 device
        )

    def _now_ns(self) -> int:
        off = self.dev.timestamp_offset_ns
        return 0 if off is None else time.monotonic_ns() + off

    def _get_timestamp(self, _: bytes) -> bytes:
        return _rsp(Opcode.GET_TIMESTAMP).pack(self._now_ns())

    def _set_timestamp(self, p: bytes) -> bytes:
        (host_ns,) = _req(Opcode.SET_TIMESTAMP).unpack(p)
        self.dev.timestamp_offset_ns = host_ns - time.monotonic_ns()
        return b""

    def _get_supported_logs(self, _: bytes) -> bytes:
        return _rsp(Opcode.GET_SUPPORTED_LOGS).pack(1, mb.CEL_UUID, len(self.cel))

    def _get_log(self, p: bytes) -> bytes:
        uuid, offset, length = _req(Opcode.GET_LOG).unpack(p)
        if uuid != mb.CEL_UUID:
            raise MailboxError(RC.INVALID_LOG, f"log {uuid.hex()} is not supported")
        if length > mb.PAYLOAD_MAX or offset + length > len(self.cel):
            raise MailboxError(
                RC.INVALID_INPUT,
                f"offset {offset} + length {length} is beyond the {len(self.cel)}-byte CEL",
            )
        return self.cel[offset : offset + length]

    # --- memory device commands ----------------------------------------------------------
    def _identify_memdev(self, _: bytes) -> bytes:
        units = self.dev.capacity // mb.CAPACITY_UNIT
        return _rsp(Opcode.IDENTIFY_MEMORY_DEVICE).pack(
            b"kvcxl fw 0.1".ljust(16, b"\0"),
            units,  # total
            units,  # volatile
            0,  # persistent
            0,  # partition alignment
            0,
            0,
            0,
            0,  # event log sizes (no event logs)
            0,  # LSA size
            POISON_LIST_MAX.to_bytes(3, "little"),
            POISON_LIST_MAX,  # inject poison limit
            0,  # poison handling capabilities
            0,  # QoS telemetry
            0,  # dynamic capacity event log size
        )

    def _get_health_info(self, _: bytes) -> bytes:
        c, h = self.dev.counters, self.dev.health
        return _rsp(Opcode.GET_HEALTH_INFO).pack(
            h["health_status"],  # 0: no maintenance needed
            h["media_status"],  # 0: normal
            0,  # additional status
            h["life_used"],  # %
            h["temperature"],  # °C; 0xFFFF: not available
            h["dirty_shutdowns"],
            min(c["poisoned_reads"], 0xFFFFFFFF),  # corrected volatile errors seen
            0,  # corrected persistent errors
        )

    def _check_dpa(self, dpa: int, nbytes: int = 64) -> None:
        if dpa & 63:
            raise MailboxError(RC.INVALID_INPUT, f"DPA {dpa:#x} is not 64-byte aligned")
        if dpa + nbytes > self.dev.capacity:
            raise MailboxError(
                RC.INVALID_PHYSICAL_ADDRESS,
                f"DPA {dpa:#x} + {nbytes} is beyond capacity {self.dev.capacity:#x}",
            )

    def _get_poison_list(self, p: bytes) -> bytes:
        dpa, lines = _req(Opcode.GET_POISON_LIST).unpack(p)
        if dpa & 63:
            raise MailboxError(RC.INVALID_INPUT, f"DPA {dpa:#x} is not 64-byte aligned")
        if lines == 0 or dpa + lines * 64 > self.dev.capacity:
            raise MailboxError(
                RC.INVALID_PHYSICAL_ADDRESS, f"range {dpa:#x} + {lines} lines is not on the device"
            )
        # (start line, n lines, source), from the device's one poison list
        records = self.dev.poison.records(dpa >> 6, (dpa >> 6) + lines)
        layout = mb.COMMANDS[Opcode.GET_POISON_LIST].response
        room = (mb.PAYLOAD_MAX - layout.fixed.size) // layout.records.itemsize
        flags = 0x1 if len(records) > room else 0  # More Media Error Records
        records = records[:room]
        out = np.zeros(len(records), layout.records)
        for i, (s, n, t) in enumerate(records):
            out[i] = ((s << 6) | t, n, 0)
        return layout.fixed.pack(flags, 0, 0, len(records)) + out.tobytes()

    def _inject_poison(self, p: bytes) -> bytes:
        (dpa,) = _req(Opcode.INJECT_POISON).unpack(p)
        self._check_dpa(dpa)
        poison = self.dev.poison
        if (dpa >> 6) not in poison and poison.injected >= POISON_LIST_MAX:
            raise MailboxError(RC.INJECT_POISON_LIMIT, f"{POISON_LIST_MAX} lines already injected")
        self.dev.inject_poison(dpa)
        return b""

    def _clear_poison(self, p: bytes) -> bytes:
        dpa, data = _req(Opcode.CLEAR_POISON).unpack(p)
        self._check_dpa(dpa)
        self.dev.clear_poison(dpa, data)
        return b""

    # --- vendor commands: the policy engine ------------------------------------------------
    def _get_param(self, p: bytes) -> bytes:
        try:
            name = p.decode("utf-8")
        except UnicodeDecodeError:
            raise MailboxError(RC.INVALID_INPUT, "parameter name is not UTF-8") from None
        values = self.dev.config.effective()
        if name:
            if name not in values:
                raise MailboxError(RC.INVALID_INPUT, f"unknown parameter {name!r}")
            values = {name: values[name]}
        return json.dumps(values).encode()

    def _set_param(self, p: bytes) -> bytes:
        if not p:
            raise MailboxError(RC.INVALID_PAYLOAD_LENGTH, "Set Policy Parameter needs a JSON body")
        try:
            changes = json.loads(p.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MailboxError(RC.INVALID_INPUT, "payload is not a UTF-8 JSON object") from None
        if not isinstance(changes, dict) or not changes:
            raise MailboxError(RC.INVALID_INPUT, "payload must be a non-empty JSON object")
        try:
            new = self.dev.config.with_(**changes)
        except ConfigError as exc:
            raise MailboxError(RC.INVALID_INPUT, str(exc)) from None
        self.dev.set_config(new)
        return b""

    def _attention_report(self, p: bytes) -> bytes:
        rec = self._records(p, Opcode.VENDOR_ATTENTION_REPORT)
        (step, _n) = _req(Opcode.VENDOR_ATTENTION_REPORT).unpack_from(p)
        ids, w = rec["entry"].astype(np.int64), rec["weight"].astype(np.float64)
        try:
            hit = self.dev.report(step, ids, w)
        except RequestError as exc:
            raise MailboxError(RC.INVALID_INPUT, str(exc)) from None
        head = _rsp(Opcode.VENDOR_ATTENTION_REPORT).pack(int(hit.sum()))
        return head + np.packbits(hit, bitorder="little").tobytes()

    def _get_stats(self, _: bytes) -> bytes:
        return json.dumps(self.dev.stats()).encode()

    def _get_victims(self, p: bytes) -> bytes:
        start, limit = _req(Opcode.VENDOR_GET_VICTIMS).unpack(p)
        layout = mb.COMMANDS[Opcode.VENDOR_GET_VICTIMS].response
        v = self.dev.victims
        room = (mb.PAYLOAD_MAX - layout.fixed.size) // layout.records.itemsize
        part = v[start : start + min(limit, room)]
        return layout.fixed.pack(len(v)) + np.array(part, layout.records).tobytes()

    def _records(self, p: bytes, op: Opcode) -> np.ndarray:
        """The request's records; the count is the last field of its fixed part."""
        layout = mb.COMMANDS[op].request
        header, dtype = layout.fixed.size, layout.records
        if len(p) < header:
            raise MailboxError(RC.INVALID_PAYLOAD_LENGTH, f"header is {header} bytes")
        n = layout.fixed.unpack_from(p)[-1]
        if len(p) != header + n * dtype.itemsize:
            raise MailboxError(
                RC.INVALID_PAYLOAD_LENGTH,
                f"{n} records need {header + n * dtype.itemsize} B, got {len(p)}",
            )
        return np.frombuffer(p, dtype=dtype, offset=header)

    def _describe_entries(self, p: bytes) -> bytes:
        r = self._records(p, Opcode.VENDOR_DESCRIBE_ENTRIES)
        try:
            self.dev.describe(r["entry"], r["ctx"], r["layer"], r["head"], r["block"])
        except RequestError as exc:
            raise MailboxError(RC.INVALID_INPUT, str(exc)) from None
        return b""

    def _set_context_lengths(self, p: bytes) -> bytes:
        r = self._records(p, Opcode.VENDOR_SET_CONTEXT_LENGTHS)
        if r.size and int(r["tokens"].max()) > 1 << 40:
            raise MailboxError(RC.INVALID_INPUT, "context lengths must be 0 … 2^40 tokens")
        try:
            self.dev.set_context_tokens(r["ctx"], r["tokens"].astype(np.int64))
        except RequestError as exc:
            raise MailboxError(RC.INVALID_INPUT, str(exc)) from None
        return b""

    def _create_entries(self, p: bytes) -> bytes:
        r = self._records(p, Opcode.VENDOR_CREATE_ENTRIES)
        (step, _n) = _req(Opcode.VENDOR_CREATE_ENTRIES).unpack_from(p)
        try:
            n = self.dev.create(step, r["entry"].astype(np.int64))
        except RequestError as exc:
            raise MailboxError(RC.INVALID_INPUT, str(exc)) from None
        return _rsp(Opcode.VENDOR_CREATE_ENTRIES).pack(n)

    def _reset(self, _: bytes) -> bytes:
        r = self.dev.reset()
        return _rsp(Opcode.VENDOR_RESET).pack(
            r["migrations_completed"], r["migrations_rolled_back"], r["pages_moved"]
        )
