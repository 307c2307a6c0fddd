"""CXL.mem messages of a Type-3 device, defined once as data: classes, fields, widths, opcodes.

This table is the single definition used by the emulator (byte encoding and
validation, below), by the RTL front end (Amaranth ``lib.data`` layouts built from
:func:`field_widths`) and by the cocotb drivers and monitors.  Import it; never copy
its numbers.  It needs only the standard library.

The subset modelled (docs/design.md, docs/device.md), with opcode encodings from CXL 2.0 / 3.x:

========  ===================================================  ===========
class     opcodes                                              data
========  ===================================================  ===========
M2S_REQ   MemInv 0000b, MemRd 0001b, MemRdData 0010b,          none
          MemSpecRd 1000b
M2S_RWD   MemWr 0001b, MemWrPtl 0010b (with byte enables)      one 64 B line
S2M_NDR   Cmp 000b, Cmp-S 001b, Cmp-E 010b                     none
S2M_DRS   MemData 000b, MemData-NXM 001b (non-existent mem)    one 64 B line
========  ===================================================  ===========

Fields keep the spec's names and widths (68 B flit formats): ``opcode`` (4 bits
M2S, 3 bits S2M), ``snp_type`` 3, ``meta_field`` 2, ``meta_value`` 2, ``tag`` 16,
``addr`` 46 = HPA bits [51:6] (the 64 B line number; bit 5 of a Req, which only
orders critical chunks, is not modelled), ``poison`` 1, ``ld_id`` 4, ``dev_load`` 2.
Three departures from the flit, each for a reason:

* the flit's per-slot ``valid`` bit is not a field: the valid/ready handshake of
  the stream carrying a message says it;
* MemWrPtl's byte enables, carried in a separate flit slot by the spec, are the
  field ``byte_enable`` (64 bits, bit i enables data byte i) of every RwD; a MemWr
  must carry all ones;
* a ``rsvd`` field pads each header to whole bytes so that ``data`` starts on a
  byte boundary.

Bit layout.  A message's fields, in table order, are packed least significant
bit first into one unsigned integer (field ``i`` starts at the sum of the widths
before it).  That is exactly the order of an Amaranth ``data.StructLayout`` built
from :func:`field_widths`.  ``data`` (512 bits, byte 0 of the line in bits 7:0)
is always the last field.

Byte encoding (emulator, socket framing, test vectors): one class byte
(:attr:`MessageClass.code`) followed by that integer in little-endian order,
:attr:`MessageClass.packed_bytes` long.  Every message class therefore has a
fixed wire length :attr:`MessageClass.wire_bytes` (M2S_REQ 11, M2S_RWD 83,
S2M_NDR 5, S2M_DRS 69).

Decoding refuses (with :class:`MessageError`, whose ``reason`` is one of
:data:`ERROR_REASONS`) an unknown class byte, a wrong length, an opcode not in the
subset, and a MemWr whose byte enables are not all ones.  Reserved bits are
ignored on receive and sent as zero, as the spec asks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from functools import cached_property
from typing import ClassVar

LINE_BYTES = 64
"""CXL.mem moves data in 64-byte cache lines."""
LINE_SHIFT = 6
ADDR_BITS = 46
"""``addr`` carries HPA[51:6]: a 52-bit host physical address space."""
HPA_LIMIT = 1 << (ADDR_BITS + LINE_SHIFT)
ALL_BYTES = (1 << LINE_BYTES) - 1
"""Byte-enable mask of a full line."""


class M2SReqOpcode(IntEnum):
    """M2S Req ``MemOpcode`` (4 bits): requests without data."""

    MEM_INV = 0b0000
    MEM_RD = 0b0001
    MEM_RD_DATA = 0b0010
    MEM_SPEC_RD = 0b1000


class M2SRwDOpcode(IntEnum):
    """M2S RwD ``MemOpcode`` (4 bits): requests carrying one line of data."""

    MEM_WR = 0b0001
    MEM_WR_PTL = 0b0010


class S2MNDROpcode(IntEnum):
    """S2M NDR ``Opcode`` (3 bits): completions without data."""

    CMP = 0b000
    CMP_S = 0b001
    CMP_E = 0b010


class S2MDRSOpcode(IntEnum):
    """S2M DRS ``Opcode`` (3 bits): data responses.

    MemData-NXM answers a read whose address no decoder maps (CXL 3.x); the
    emulator also sets ``poison`` on it so that a 2.0 host consumes it as an error.
    """

    MEM_DATA = 0b000
    MEM_DATA_NXM = 0b001


class SnpType(IntEnum):
    """M2S ``SnpType`` (3 bits)."""

    NO_OP = 0b000
    SNP_DATA = 0b001
    SNP_CUR = 0b010
    SNP_INV = 0b011


class MetaField(IntEnum):
    """``MetaField`` (2 bits): which metadata ``meta_value`` updates."""

    META0_STATE = 0b00
    NO_OP = 0b11


class MetaValue(IntEnum):
    """``MetaValue`` (2 bits) for Meta0-State."""

    INVALID = 0b00
    ANY = 0b10
    SHARED = 0b11


class DevLoad(IntEnum):
    """S2M ``DevLoad`` (2 bits): the device's load indication for host QoS."""

    LIGHT = 0b00
    OPTIMAL = 0b01
    MODERATE_OVERLOAD = 0b10
    SEVERE_OVERLOAD = 0b11


@dataclass(frozen=True)
class Field:
    """One field of a message: its name (also the Python attribute), width in bits, meaning."""

    name: str
    width: int
    doc: str


@dataclass(frozen=True)
class MessageClass:
    """One CXL.mem message class: wire code, fields in packing order, opcode enum."""

    name: str
    code: int
    fields: tuple[Field, ...]
    opcodes: type[IntEnum]
    doc: str

    @cached_property
    def bits(self) -> int:
        return sum(f.width for f in self.fields)

    @cached_property
    def packed_bytes(self) -> int:
        return self.bits // 8

    @cached_property
    def wire_bytes(self) -> int:
        return 1 + self.packed_bytes

    @cached_property
    def has_data(self) -> bool:
        return self.fields[-1].name == "data"

    def offsets(self) -> dict[str, tuple[int, int]]:
        """``{field: (lsb, width)}`` in the packed integer."""
        out: dict[str, tuple[int, int]] = {}
        lsb = 0
        for f in self.fields:
            out[f.name] = (lsb, f.width)
            lsb += f.width
        return out


_OPCODE_M2S = Field("opcode", 4, "MemOpcode")
_OPCODE_S2M = Field("opcode", 3, "Opcode")
_SNP = Field("snp_type", 3, "SnpType (SnpType enum); NO_OP for a Type-3 device")
_MF = Field("meta_field", 2, "MetaField (MetaField enum)")
_MV = Field("meta_value", 2, "MetaValue (MetaValue enum)")
_TAG = Field("tag", 16, "host tag, echoed in the response")
_ADDR = Field("addr", ADDR_BITS, "HPA[51:6]: line number of the 64 B line")
_POISON = Field("poison", 1, "the data is poisoned")
_LDID = Field("ld_id", 4, "logical device id (multi-logical devices); 0 here")
_DEVLOAD = Field("dev_load", 2, "DevLoad (DevLoad enum)")
_DATA = Field("data", LINE_BYTES * 8, "the 64 B line, byte 0 in bits 7:0")

M2S_REQ = MessageClass(
    "M2S_REQ",
    1,
    (_OPCODE_M2S, _SNP, _MF, _MV, _TAG, _ADDR, _LDID, Field("rsvd", 3, "zero")),
    M2SReqOpcode,
    "Master-to-subordinate request without data (reads, invalidate).",
)
M2S_RWD = MessageClass(
    "M2S_RWD",
    2,
    (
        _OPCODE_M2S,
        _SNP,
        _MF,
        _MV,
        _TAG,
        _ADDR,
        _POISON,
        _LDID,
        Field("byte_enable", LINE_BYTES, "bit i enables data byte i; all ones for MemWr"),
        Field("rsvd", 2, "zero"),
        _DATA,
    ),
    M2SRwDOpcode,
    "Master-to-subordinate request with one line of data (writes).",
)
S2M_NDR = MessageClass(
    "S2M_NDR",
    3,
    (_OPCODE_S2M, _MF, _MV, _TAG, _LDID, _DEVLOAD, Field("rsvd", 3, "zero")),
    S2MNDROpcode,
    "Subordinate-to-master no-data response (write and invalidate completions).",
)
S2M_DRS = MessageClass(
    "S2M_DRS",
    4,
    (_OPCODE_S2M, _MF, _MV, _TAG, _POISON, _LDID, _DEVLOAD, Field("rsvd", 2, "zero"), _DATA),
    S2MDRSOpcode,
    "Subordinate-to-master data response (read data, possibly poisoned).",
)

MESSAGE_CLASSES: tuple[MessageClass, ...] = (M2S_REQ, M2S_RWD, S2M_NDR, S2M_DRS)
BY_CODE: dict[int, MessageClass] = {c.code: c for c in MESSAGE_CLASSES}

ERROR_REASONS: tuple[str, ...] = (
    "empty",
    "unknown_class",
    "bad_length",
    "bad_opcode",
    "bad_field",
    "bad_byte_enable",
)


class MessageError(ValueError):
    """A message that cannot be encoded or decoded; ``reason`` is one of ERROR_REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def field_widths(cls: MessageClass) -> dict[str, int]:
    """``{field name: width}`` in packing order (for ``amaranth.lib.data.StructLayout``)."""
    return {f.name: f.width for f in cls.fields}


# --- message values -------------------------------------------------------------------
@dataclass(frozen=True)
class M2SReq:
    """M2S Req: ``opcode`` (M2SReqOpcode), ``tag``, ``addr`` = HPA >> 6."""

    opcode: int
    tag: int
    addr: int
    snp_type: int = SnpType.NO_OP
    meta_field: int = MetaField.NO_OP
    meta_value: int = MetaValue.INVALID
    ld_id: int = 0
    CLASS: ClassVar[MessageClass] = M2S_REQ


@dataclass(frozen=True)
class M2SRwD:
    """M2S RwD: a write of ``data`` (64 bytes) under ``byte_enable`` to line ``addr``."""

    opcode: int
    tag: int
    addr: int
    data: bytes
    byte_enable: int = ALL_BYTES
    poison: int = 0
    snp_type: int = SnpType.NO_OP
    meta_field: int = MetaField.NO_OP
    meta_value: int = MetaValue.INVALID
    ld_id: int = 0
    CLASS: ClassVar[MessageClass] = M2S_RWD


@dataclass(frozen=True)
class S2MNDR:
    """S2M NDR: completion ``opcode`` (S2MNDROpcode) for ``tag``."""

    opcode: int
    tag: int
    meta_field: int = MetaField.NO_OP
    meta_value: int = MetaValue.INVALID
    ld_id: int = 0
    dev_load: int = DevLoad.LIGHT
    CLASS: ClassVar[MessageClass] = S2M_NDR


@dataclass(frozen=True)
class S2MDRS:
    """S2M DRS: ``data`` (64 bytes) for ``tag``; ``poison`` marks it unusable."""

    opcode: int
    tag: int
    data: bytes
    poison: int = 0
    meta_field: int = MetaField.NO_OP
    meta_value: int = MetaValue.INVALID
    ld_id: int = 0
    dev_load: int = DevLoad.LIGHT
    CLASS: ClassVar[MessageClass] = S2M_DRS


Message = M2SReq | M2SRwD | S2MNDR | S2MDRS
_VALUE_TYPES: dict[str, type] = {
    "M2S_REQ": M2SReq,
    "M2S_RWD": M2SRwD,
    "S2M_NDR": S2MNDR,
    "S2M_DRS": S2MDRS,
}
# Attribute names of each value type, in dataclass order (for decode).
_ATTRS = {name: tuple(f.name for f in fields(t)) for name, t in _VALUE_TYPES.items()}
_OFFSETS = {c.name: c.offsets() for c in MESSAGE_CLASSES}
# Header fields (neither reserved nor data) and header byte counts, for the fast codec.
_HEADER_OFFSETS = {
    c.name: tuple((n, o) for n, o in _OFFSETS[c.name].items() if n not in ("rsvd", "data"))
    for c in MESSAGE_CLASSES
}
_DATA_CLASSES = frozenset(c.name for c in MESSAGE_CLASSES if c.has_data)
_OPCODE_VALUES = {c.name: frozenset(int(o) for o in c.opcodes) for c in MESSAGE_CLASSES}
_HEADER_BYTES = {
    c.name: (c.bits - (LINE_BYTES * 8 if c.has_data else 0)) // 8 for c in MESSAGE_CLASSES
}


def validate(msg: Message) -> None:
    """Raise :class:`MessageError` unless every field of ``msg`` fits and means something."""
    cls = msg.CLASS
    for name, (_lsb, width) in _HEADER_OFFSETS[cls.name]:
        v = getattr(msg, name)
        if not isinstance(v, int) or v < 0 or v >> width:
            raise MessageError(
                "bad_field", f"{cls.name}.{name} = {v!r} does not fit in {width} bits"
            )
    if cls.name in _DATA_CLASSES:
        v = msg.data
        if not isinstance(v, bytes | bytearray) or len(v) != LINE_BYTES:
            n = len(v) if isinstance(v, bytes | bytearray) else type(v).__name__
            raise MessageError("bad_field", f"{cls.name}.data must be {LINE_BYTES} bytes, got {n}")
    if msg.opcode not in _OPCODE_VALUES[cls.name]:
        raise MessageError(
            "bad_opcode", f"{cls.name} opcode {msg.opcode:#x} is not in the modelled subset"
        )
    if cls is M2S_RWD and msg.opcode == M2SRwDOpcode.MEM_WR and msg.byte_enable != ALL_BYTES:
        raise MessageError(
            "bad_byte_enable", f"MemWr needs all 64 byte enables, got {msg.byte_enable:#018x}"
        )


def pack(msg: Message) -> int:
    """The packed integer of ``msg`` (fields LSB first in table order), after validation."""
    validate(msg)
    word = 0
    for name, (lsb, _width) in _OFFSETS[msg.CLASS.name].items():
        if name == "rsvd":
            continue
        v = getattr(msg, name)
        if name == "data":
            v = int.from_bytes(v, "little")
        word |= int(v) << lsb
    return word


def unpack(cls: MessageClass, word: int) -> Message:
    """The message of class ``cls`` whose packed integer is ``word`` (validated)."""
    values: dict[str, object] = {}
    for name, (lsb, width) in _OFFSETS[cls.name].items():
        if name == "rsvd":
            continue
        v = (word >> lsb) & ((1 << width) - 1)
        values[name] = v.to_bytes(LINE_BYTES, "little") if name == "data" else v
    msg = _VALUE_TYPES[cls.name](**values)
    validate(msg)
    return msg


def encode(msg: Message) -> bytes:
    """Wire bytes: class code, then the packed integer little-endian."""
    cls = msg.CLASS
    validate(msg)
    # ``data`` is the last field and starts on a byte boundary: pack only the header as
    # an integer and append the line's bytes (same bytes as packing everything).
    hdr = 0
    for name, (lsb, _w) in _HEADER_OFFSETS[cls.name]:
        hdr |= int(getattr(msg, name)) << lsb
    head = bytes((cls.code,)) + hdr.to_bytes(_HEADER_BYTES[cls.name], "little")
    return head + bytes(msg.data) if cls.has_data else head


def decode(buf: bytes | bytearray | memoryview) -> Message:
    """The message encoded in ``buf`` (exactly one message); MessageError if malformed."""
    if len(buf) == 0:
        raise MessageError("empty", "no bytes")
    cls = BY_CODE.get(buf[0])
    if cls is None:
        raise MessageError("unknown_class", f"class byte {buf[0]:#04x} is not a CXL.mem class")
    if len(buf) != cls.wire_bytes:
        raise MessageError(
            "bad_length", f"{cls.name} is {cls.wire_bytes} bytes on the wire, got {len(buf)}"
        )
    nh = _HEADER_BYTES[cls.name]
    hdr = int.from_bytes(buf[1 : 1 + nh], "little")
    values: dict[str, object] = {
        name: (hdr >> lsb) & ((1 << width) - 1) for name, (lsb, width) in _HEADER_OFFSETS[cls.name]
    }
    if cls.has_data:
        values["data"] = bytes(buf[1 + nh :])
    msg = _VALUE_TYPES[cls.name](**values)
    validate(msg)
    return msg


def describe() -> str:
    """A human-readable table of every class and field (for docs and ``--help``)."""
    lines = []
    for c in MESSAGE_CLASSES:
        lines.append(f"{c.name} (class byte {c.code}, {c.wire_bytes} B on the wire): {c.doc}")
        for name, (lsb, width) in c.offsets().items():
            lines.append(f"  [{lsb + width - 1:3d}:{lsb:3d}] {name:12s} {width:3d} bits")
        ops = ", ".join(f"{o.name}={o.value:#x}" for o in c.opcodes)
        lines.append(f"  opcodes: {ops}")
    return "\n".join(lines)


__all__ = [
    "ADDR_BITS",
    "ALL_BYTES",
    "BY_CODE",
    "ERROR_REASONS",
    "HPA_LIMIT",
    "LINE_BYTES",
    "LINE_SHIFT",
    "M2S_REQ",
    "M2S_RWD",
    "MESSAGE_CLASSES",
    "S2MDRS",
    "S2MNDR",
    "S2M_DRS",
    "S2M_NDR",
    "DevLoad",
    "Field",
    "M2SReq",
    "M2SReqOpcode",
    "M2SRwD",
    "M2SRwDOpcode",
    "Message",
    "MessageClass",
    "MessageError",
    "MetaField",
    "MetaValue",
    "S2MDRSOpcode",
    "S2MNDROpcode",
    "SnpType",
    "decode",
    "describe",
    "encode",
    "field_widths",
    "pack",
    "unpack",
    "validate",
]
