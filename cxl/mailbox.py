"""The CCI mailbox: command opcodes, return codes and message framing, defined once.

Opcodes are ``command_set << 8 | command`` as in CXL 2.0 §8.2.9 / r3.1 §8.2.9;
return codes are the Command Return Codes of CXL 2.0 §8.2.8.4.5.1 (extended in
3.x).  The numbers here match the Linux ``drivers/cxl`` and QEMU ``hw/cxl``
mailbox code.  Vendor-specific opcodes C000h … C0FFh carry the policy engine's
commands (documented in docs/device.md).

Message framing (CXL r3.1 Figure 7-19, the CCI message format, 12-byte header,
little endian)::

    byte 0      category (0 = request, 1 = response)
    byte 1      tag (echoed)
    byte 2      reserved
    byte 3      command
    byte 4      command set
    bytes 5-7   payload length (24 bits)
    bytes 8-9   return code (responses)
    bytes 10-11 vendor-specific status
    bytes 12-   payload

``COMMANDS`` is the one command table (as QEMU's ``hw/cxl/cxl-mailbox-utils.c``
keeps one): each row holds the opcode, name, handler, request and response payload
layouts (struct formats and numpy record dtypes), the Command Effects Log bits and
whether the patched QEMU forwards the command to the device (``forwarded``).
A command's input length is fixed (the request layout has no records or tail) or
variable; a request whose payload length differs from a fixed length is answered
with Invalid Payload Length, as the spec and QEMU do.  The guest ring
(``kvcxl.cxl.ring``) reuses the vendor opcodes and records that mean the same.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

HEADER_BYTES = 12
PAYLOAD_MAX = 1 << 16
"""Largest payload this device accepts or returns (reported by Identify as 2^16)."""
CAT_REQUEST = 0
CAT_RESPONSE = 1
CAPACITY_UNIT = 256 << 20
"""Identify Memory Device reports capacities in 256 MiB units."""
PCI_VENDOR_ID = 0x1B36
"""Identify's PCI vendor id (and subsystem vendor id): Red Hat, Inc., QEMU's emulated devices."""
PCI_DEVICE_ID = 0x0D93
"""Identify's PCI device id: QEMU's CXL Type-3 device."""


class ReturnCode(IntEnum):
    """Command Return Codes (CXL 2.0 §8.2.8.4.5.1, r3.x additions from 17h)."""

    SUCCESS = 0x00
    BACKGROUND_STARTED = 0x01
    INVALID_INPUT = 0x02
    UNSUPPORTED = 0x03
    INTERNAL_ERROR = 0x04
    RETRY_REQUIRED = 0x05
    BUSY = 0x06
    MEDIA_DISABLED = 0x07
    FW_TRANSFER_IN_PROGRESS = 0x08
    FW_TRANSFER_OUT_OF_ORDER = 0x09
    FW_AUTH_FAILED = 0x0A
    FW_INVALID_SLOT = 0x0B
    FW_ROLLED_BACK = 0x0C
    FW_RESET_REQUIRED = 0x0D
    INVALID_HANDLE = 0x0E
    INVALID_PHYSICAL_ADDRESS = 0x0F
    INJECT_POISON_LIMIT = 0x10
    PERMANENT_MEDIA_FAILURE = 0x11
    ABORTED = 0x12
    INVALID_SECURITY_STATE = 0x13
    INCORRECT_PASSPHRASE = 0x14
    UNSUPPORTED_MAILBOX = 0x15
    INVALID_PAYLOAD_LENGTH = 0x16
    INVALID_LOG = 0x17
    INTERRUPTED = 0x18
    UNSUPPORTED_FEATURE_VERSION = 0x19
    UNSUPPORTED_FEATURE_SELECTION = 0x1A
    FEATURE_TRANSFER_IN_PROGRESS = 0x1B
    FEATURE_TRANSFER_OUT_OF_ORDER = 0x1C
    RESOURCES_EXHAUSTED = 0x1D


class Opcode(IntEnum):
    """Opcodes this device implements."""

    IDENTIFY = 0x0001  # Information and Status: Identify
    GET_TIMESTAMP = 0x0300
    SET_TIMESTAMP = 0x0301
    GET_SUPPORTED_LOGS = 0x0400
    GET_LOG = 0x0401
    IDENTIFY_MEMORY_DEVICE = 0x4000
    GET_HEALTH_INFO = 0x4200
    GET_POISON_LIST = 0x4300
    INJECT_POISON = 0x4301
    CLEAR_POISON = 0x4302
    # Vendor specific (C000h …): the policy engine.
    VENDOR_GET_PARAM = 0xC000
    VENDOR_SET_PARAM = 0xC001
    VENDOR_ATTENTION_REPORT = 0xC002
    VENDOR_GET_STATS = 0xC003
    VENDOR_GET_VICTIMS = 0xC004
    VENDOR_DESCRIBE_ENTRIES = 0xC005
    VENDOR_SET_CONTEXT_LENGTHS = 0xC006
    VENDOR_CREATE_ENTRIES = 0xC007
    VENDOR_RESET = 0xC008  # CXL has no full device reset command: a vendor one


# Command Effects Log effect bits (CXL 2.0 Table 173).
EFFECT_CONFIG_CHANGE_COLD_RESET = 1 << 0
EFFECT_IMMEDIATE_CONFIG_CHANGE = 1 << 1
EFFECT_IMMEDIATE_DATA_CHANGE = 1 << 2
EFFECT_IMMEDIATE_POLICY_CHANGE = 1 << 3
EFFECT_IMMEDIATE_LOG_CHANGE = 1 << 4


# --- payload layouts ------------------------------------------------------------------
# Every request and response payload, defined once; the command table below names them
# and the handlers (emu/device/cci.py) and the guest ring (cxl/ring.py,
# qemu/guest/kvcxl_ring.h) use these objects.
ATTENTION_RECORD = np.dtype([("entry", "<u4"), ("weight", "<f4")])
"""Attention Report record, also the ring's ATTN record and the trace area's READ record.

Weights are f32: the model produces them in ≤ 32-bit floats and workload streams keep them
as f32 (``ReadStream.w``), the guest agent writes them from that trace, and the firmware
widens them to f64 on reading — f64 on the wire would double the bytes and add nothing."""


def attention_weights_valid(w: np.ndarray) -> bool:
    """The rule for an attention record's weights, wherever they arrive (the Attention
    Report, the ring's ATTN, the trace area): finite and within [0, 1]."""
    return bool(np.isfinite(w).all() and (w.size == 0 or (w.min() >= 0.0 and w.max() <= 1.0)))


DESCRIBE_RECORD = np.dtype(
    [("entry", "<u4"), ("ctx", "<u4"), ("layer", "<u2"), ("head", "<u2"), ("block", "<u4")]
)
"""Describe Entries record, also the ring's CREATE record (16 B)."""
LENGTH_RECORD = np.dtype([("ctx", "<u4"), ("tokens", "<u8")])
"""Set Context Lengths record, also the ring's CTX_LEN record (12 B, packed)."""
ENTRY_RECORD = np.dtype([("entry", "<u4")])
"""Create Entries record: an entry id."""
VICTIM_RECORD = np.dtype([("time", "<u4"), ("entry", "<u4"), ("priority", "<f8")])
"""Get Victim Log record (16 B)."""


@dataclass(frozen=True)
class Payload:
    """One payload: a fixed little-endian part, then optionally records or a free tail.

    ``fmt`` is a :mod:`struct` format without byte order; ``fields`` names its items for
    the documentation.  With ``records`` the fixed part ends with the record count.
    """

    fmt: str = ""
    fields: str = ""
    records: np.dtype | None = None
    tail: str = ""  # a variable part that is not records: "JSON", "UTF-8 name", ...

    @property
    def fixed(self) -> struct.Struct:
        return struct.Struct("<" + self.fmt)

    @property
    def size(self) -> int | None:
        """Bytes, when fixed; None when variable."""
        return None if self.records is not None or self.tail else self.fixed.size

    def describe(self) -> str:
        parts = [self.fields] if self.fields else []
        if self.records is not None:
            parts.append(f"n × {record_text(self.records)}")
        if self.tail:
            parts.append(self.tail)
        return ", ".join(parts) or "—"


def record_text(dt: np.dtype) -> str:
    """``(u32 entry, f32 weight)`` for a record dtype."""
    if dt.names is None:
        return f"{dt.kind}{dt.itemsize * 8}"
    items = [f"{dt[n].kind}{dt[n].itemsize * 8} {n}" for n in dt.names]
    return "(" + ", ".join(items) + ")"


NONE = Payload()


@dataclass(frozen=True)
class Command:
    """One row of the command table: everything about one opcode."""

    opcode: Opcode
    name: str
    handler: str  # method of kvcxl.emu.device.cci.Mailbox (a name: no emulator import here)
    request: Payload
    response: Payload
    effects: int
    doc: str = ""
    forwarded: bool = False
    """The patched QEMU hands this command to the kvcxl device (kvcxl.qemu.qemu_patch
    generates the list from this column); every other command stays QEMU's."""

    @property
    def in_len(self) -> int | None:
        """Fixed input payload length, None = variable."""
        return self.request.size


# forwarded=True: the commands the kvcxl device answers in QEMU's place (its identity, its
# clock, its health, its poison list); every other command stays QEMU's (docs/qemu.md says
# why: the CEL must list QEMU's own commands, the event logs are where QEMU puts its events,
# Linux's probe needs the rest as QEMU models them).
COMMANDS: dict[int, Command] = {
    c.opcode: c
    for c in (
        Command(Opcode.IDENTIFY, "Identify", "_identify", NONE,
                Payload("HHHHQBB", "18 B: PCI ids, u64 serial, max message size 2^16, "
                        "component type 3"), 0, forwarded=True),
        Command(Opcode.GET_TIMESTAMP, "Get Timestamp", "_get_timestamp",
                NONE, Payload("Q", "u64 ns"), 0, "0 until set", forwarded=True),
        Command(Opcode.SET_TIMESTAMP, "Set Timestamp", "_set_timestamp",
                Payload("Q", "u64 ns since the epoch"), NONE, EFFECT_IMMEDIATE_POLICY_CHANGE,
                forwarded=True),
        Command(Opcode.GET_SUPPORTED_LOGS, "Get Supported Logs", "_get_supported_logs",
                NONE, Payload("H6x16sI", "u16 entries = 1, CEL UUID, u32 CEL size"), 0),
        Command(Opcode.GET_LOG, "Get Log", "_get_log",
                Payload("16sII", "UUID, u32 offset, u32 length"),
                Payload(tail="CEL bytes (u16 opcode, u16 effects per command)"), 0),
        Command(Opcode.IDENTIFY_MEMORY_DEVICE, "Identify Memory Device", "_identify_memdev",
                NONE, Payload("16sQQQQHHHHI3sHBBH", "0x45 B: capacities in 256 MiB units, "
                              "poison list max 256"), 0),
        Command(Opcode.GET_HEALTH_INFO, "Get Health Info", "_get_health_info",
                NONE, Payload("BBBBHIII", "18 B health record"), 0, forwarded=True),
        Command(Opcode.GET_POISON_LIST, "Get Poison List", "_get_poison_list",
                Payload("QQ", "u64 DPA, u64 length in lines"),
                Payload("BBQH20x", "32 B header",
                        np.dtype([("dpa_source", "<u8"), ("lines", "<u4"), ("rsvd", "<u4")])),
                0, forwarded=True),
        Command(Opcode.INJECT_POISON, "Inject Poison", "_inject_poison",
                Payload("Q", "u64 DPA (64 B aligned)"), NONE, EFFECT_IMMEDIATE_DATA_CHANGE,
                forwarded=True),
        Command(Opcode.CLEAR_POISON, "Clear Poison", "_clear_poison",
                Payload("Q64s", "u64 DPA, 64 B of replacement data"), NONE,
                EFFECT_IMMEDIATE_DATA_CHANGE, forwarded=True),
        Command(Opcode.VENDOR_GET_PARAM, "Get Policy Parameter", "_get_param",
                Payload(tail="UTF-8 name (empty = all)"), Payload(tail="JSON {name: value}"), 0),
        Command(Opcode.VENDOR_SET_PARAM, "Set Policy Parameter", "_set_param",
                Payload(tail="JSON object {name: value, ...}"), NONE,
                EFFECT_IMMEDIATE_POLICY_CHANGE, "validated by PolicyConfig"),
        Command(Opcode.VENDOR_ATTENTION_REPORT, "Attention Report", "_attention_report",
                Payload("II", "u32 step, u32 n", ATTENTION_RECORD),
                Payload("I", "u32 hits", tail="hit bitmap (LSB first)"),
                EFFECT_IMMEDIATE_DATA_CHANGE),
        Command(Opcode.VENDOR_GET_STATS, "Get Statistics", "_get_stats",
                NONE, Payload(tail="JSON (counters, tiers, policy cache, audit, latency)"), 0),
        Command(Opcode.VENDOR_GET_VICTIMS, "Get Victim Log", "_get_victims",
                Payload("II", "u32 first, u32 max"),
                Payload("I", "u32 total", VICTIM_RECORD), 0,
                "empty unless recording (serve --record-victims)"),
        Command(Opcode.VENDOR_DESCRIBE_ENTRIES, "Describe Entries", "_describe_entries",
                Payload("I", "u32 n", DESCRIBE_RECORD), NONE, EFFECT_IMMEDIATE_POLICY_CHANGE),
        Command(Opcode.VENDOR_SET_CONTEXT_LENGTHS, "Set Context Lengths",
                "_set_context_lengths", Payload("I", "u32 n", LENGTH_RECORD), NONE,
                EFFECT_IMMEDIATE_POLICY_CHANGE),
        Command(Opcode.VENDOR_CREATE_ENTRIES, "Create Entries", "_create_entries",
                Payload("II", "u32 step, u32 n", ENTRY_RECORD), Payload("I", "u32 admitted"),
                EFFECT_IMMEDIATE_DATA_CHANGE),
        Command(Opcode.VENDOR_RESET, "Reset Firmware", "_reset", NONE,
                Payload("III", "u32 migrations completed, u32 rolled back, u32 pages moved"),
                EFFECT_IMMEDIATE_POLICY_CHANGE | EFFECT_IMMEDIATE_LOG_CHANGE,
                "what it keeps and drops: docs/reliability.md"),
    )
}  # fmt: skip


def markdown_table() -> str:
    """The command table as docs/device.md shows it (a test keeps the two equal)."""
    lines = [
        "| opcode | command | input | output | effects | under QEMU |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted(COMMANDS.values(), key=lambda c: c.opcode):
        out = c.response.describe() + (f"; {c.doc}" if c.doc else "")
        fwd = "forwarded" if c.forwarded else "QEMU's"
        lines.append(
            f"| {c.opcode:04X}h | {c.name} | {c.request.describe()} | {out} | {c.effects:#x} "
            f"| {fwd} |"
        )
    return "\n".join(lines)


CEL_UUID = bytes.fromhex("0da9c0b5bf414b788f7996b1623b3f17")
"""Command Effects Log UUID (CXL 2.0 §8.2.9.4.1.1), in wire byte order."""


class FramingError(ValueError):
    """A CCI message that cannot be parsed; ``rc`` is the return code to answer with."""

    def __init__(self, rc: ReturnCode, detail: str) -> None:
        super().__init__(f"{rc.name}: {detail}")
        self.rc = rc


@dataclass(frozen=True)
class CciMessage:
    category: int
    tag: int
    opcode: int
    payload: bytes
    rc: int = 0
    vendor_status: int = 0

    def encode(self) -> bytes:
        n = len(self.payload)
        if n >= 1 << 24:
            raise FramingError(ReturnCode.INVALID_PAYLOAD_LENGTH, f"payload of {n} bytes")
        hdr = bytes(
            (
                self.category & 0xFF,
                self.tag & 0xFF,
                0,
                self.opcode & 0xFF,
                (self.opcode >> 8) & 0xFF,
            )
        )
        return (
            hdr
            + n.to_bytes(3, "little")
            + (self.rc & 0xFFFF).to_bytes(2, "little")
            + (self.vendor_status & 0xFFFF).to_bytes(2, "little")
            + bytes(self.payload)
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> CciMessage:
        if len(buf) < HEADER_BYTES:
            raise FramingError(
                ReturnCode.INVALID_PAYLOAD_LENGTH,
                f"message of {len(buf)} bytes is shorter than the {HEADER_BYTES}-byte header",
            )
        n = int.from_bytes(buf[5:8], "little")
        if n != len(buf) - HEADER_BYTES:
            raise FramingError(
                ReturnCode.INVALID_PAYLOAD_LENGTH,
                f"header says {n} payload bytes, message carries {len(buf) - HEADER_BYTES}",
            )
        return cls(
            category=buf[0],
            tag=buf[1],
            opcode=buf[3] | buf[4] << 8,
            payload=bytes(buf[HEADER_BYTES:]),
            rc=int.from_bytes(buf[8:10], "little"),
            vendor_status=int.from_bytes(buf[10:12], "little"),
        )


def request(opcode: int, payload: bytes = b"", tag: int = 0) -> bytes:
    """Encoded request message."""
    return CciMessage(CAT_REQUEST, tag, opcode, payload).encode()
