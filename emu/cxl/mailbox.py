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

Each command's input length is fixed (``in_len``) or variable (``None``); a request
whose payload length differs from a fixed ``in_len`` is answered with Invalid
Payload Length, as the spec and QEMU do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

HEADER_BYTES = 12
PAYLOAD_MAX = 1 << 16
"""Largest payload this device accepts or returns (reported by Identify as 2^16)."""
CAT_REQUEST = 0
CAT_RESPONSE = 1


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


# Command Effects Log effect bits (CXL 2.0 Table 173).
EFFECT_CONFIG_CHANGE_COLD_RESET = 1 << 0
EFFECT_IMMEDIATE_CONFIG_CHANGE = 1 << 1
EFFECT_IMMEDIATE_DATA_CHANGE = 1 << 2
EFFECT_IMMEDIATE_POLICY_CHANGE = 1 << 3
EFFECT_IMMEDIATE_LOG_CHANGE = 1 << 4


@dataclass(frozen=True)
class Command:
    opcode: Opcode
    name: str
    in_len: int | None  # fixed input payload length, None = variable
    effects: int
    doc: str


COMMANDS: dict[int, Command] = {
    c.opcode: c
    for c in (
        Command(Opcode.IDENTIFY, "Identify", 0, 0, "18 B: PCI ids, serial, max message size"),
        Command(Opcode.GET_TIMESTAMP, "Get Timestamp", 0, 0, "8 B: ns since the epoch"),
        Command(
            Opcode.SET_TIMESTAMP,
            "Set Timestamp",
            8,
            EFFECT_IMMEDIATE_POLICY_CHANGE,
            "in 8 B: ns since the epoch",
        ),
        Command(Opcode.GET_SUPPORTED_LOGS, "Get Supported Logs", 0, 0, "one entry: the CEL"),
        Command(Opcode.GET_LOG, "Get Log", 0x18, 0, "in: UUID, offset, length"),
        Command(Opcode.IDENTIFY_MEMORY_DEVICE, "Identify Memory Device", 0, 0, "0x45 B"),
        Command(Opcode.GET_HEALTH_INFO, "Get Health Info", 0, 0, "18 B health record"),
        Command(Opcode.GET_POISON_LIST, "Get Poison List", 16, 0, "in: DPA, length in lines"),
        Command(
            Opcode.INJECT_POISON,
            "Inject Poison",
            8,
            EFFECT_IMMEDIATE_DATA_CHANGE,
            "in: DPA (64 B aligned)",
        ),
        Command(
            Opcode.CLEAR_POISON,
            "Clear Poison",
            72,
            EFFECT_IMMEDIATE_DATA_CHANGE,
            "in: DPA, 64 B of replacement data",
        ),
        Command(
            Opcode.VENDOR_GET_PARAM,
            "Get Policy Parameter",
            None,
            0,
            "in: parameter name (UTF-8, empty = all); out: JSON",
        ),
        Command(
            Opcode.VENDOR_SET_PARAM,
            "Set Policy Parameter",
            None,
            EFFECT_IMMEDIATE_POLICY_CHANGE,
            "in: JSON object {name: value, ...}; validated by PolicyConfig",
        ),
        Command(
            Opcode.VENDOR_ATTENTION_REPORT,
            "Attention Report",
            None,
            EFFECT_IMMEDIATE_DATA_CHANGE,
            "in: u32 step, u32 count, count × (u32 entry, f64 weight); out: hit bitmap",
        ),
        Command(
            Opcode.VENDOR_GET_STATS,
            "Get Statistics",
            0,
            0,
            "out: JSON statistics (tiers, policy cache, audit, timing)",
        ),
        Command(
            Opcode.VENDOR_GET_VICTIMS,
            "Get Victim Log",
            8,
            0,
            "in: u32 first, u32 max; out: u32 total, records (u32 time, u32 entry, f64 priority)",
        ),
        Command(
            Opcode.VENDOR_DESCRIBE_ENTRIES,
            "Describe Entries",
            None,
            EFFECT_IMMEDIATE_POLICY_CHANGE,
            "in: u32 n, n × (u32 entry, u32 context, u16 layer, u16 kv_head, u32 block)",
        ),
        Command(
            Opcode.VENDOR_SET_CONTEXT_LENGTHS,
            "Set Context Lengths",
            None,
            EFFECT_IMMEDIATE_POLICY_CHANGE,
            "in: u32 n, n × (u32 context, u64 tokens)",
        ),
        Command(
            Opcode.VENDOR_CREATE_ENTRIES,
            "Create Entries",
            None,
            EFFECT_IMMEDIATE_DATA_CHANGE,
            "in: u32 step, u32 n, n × u32 entry; out: u32 admitted",
        ),
    )
}

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
