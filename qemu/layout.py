"""The device-memory protocol between the guest agent and the firmware service.

The one source of these numbers for C is ``guest/kvcxl_ring.h``; this module mirrors
it (a test compiles a C program that prints the header's values and compares).
docs/qemu.md explains the protocol: layout, doorbell, ordering, error codes.

Addresses are device physical addresses (DPA): offsets into ``/dev/dax0.0`` in the
guest and into the media file on the host.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

MiB = 1 << 20

# --- DPA map ---------------------------------------------------------------------------
RING_BASE = 0x000000
TRACE_BASE = 0x100000
TRACE_SIZE = 0x700000
XFER_BASE = 0x800000
XFER_H2G = XFER_BASE
XFER_G2H = XFER_BASE + 0x400000
XFER_BYTES = 0x10000
KV_BASE = 0x1000000
SEED_H2G = 0x48324755
SEED_G2H = 0x47324855

# --- ring geometry ---------------------------------------------------------------------
RING_MAGIC = 0x5152434B
RING_VERSION = 1
DEV_HDR = 0x0000
HOST_HDR = 0x0040
SQ = 0x1000
CQ = 0x2000
SLOTS = 0x4000
DEPTH = 32
ENTRY = 64
SLOT_IN = 8192
SLOT_OUT = 16384
SLOT_STRIDE = SLOT_IN + SLOT_OUT
ATTN_MAX = SLOT_IN // 8  # records per ATTN command (1024: any response fits SLOT_OUT)
CREATE_MAX = SLOT_IN // 16  # records per CREATE command
CTX_LEN_MAX = SLOT_IN // 8

DEV_OFF, DEV_READY, DEV_FAULT, DEV_STOPPED = 0, 1, 2, 3

OP_NOP = 0xC000
OP_OPEN = 0xC001
OP_ATTN = 0xC002
OP_END_STEP = 0xC003
OP_STATS = 0xC004
OP_POISON = 0xC005
OP_CLOSE = 0xC006
OP_CREATE = 0xC007
OP_CTX_LEN = 0xC008
OPCODES = {
    OP_NOP: "NOP",
    OP_OPEN: "OPEN",
    OP_ATTN: "ATTN",
    OP_END_STEP: "END_STEP",
    OP_STATS: "STATS",
    OP_POISON: "POISON",
    OP_CLOSE: "CLOSE",
    OP_CREATE: "CREATE",
    OP_CTX_LEN: "CTX_LEN",
}

RC_SUCCESS = 0x0000
RC_INVALID_INPUT = 0x0002
RC_UNSUPPORTED = 0x0003
RC_INTERNAL = 0x0004
RC_INVALID_PAYLOAD_LENGTH = 0x0016
RC_NAMES = {
    RC_SUCCESS: "Success",
    RC_INVALID_INPUT: "Invalid Input",
    RC_UNSUPPORTED: "Unsupported",
    RC_INTERNAL: "Internal Error",
    RC_INVALID_PAYLOAD_LENGTH: "Invalid Payload Length",
}

# struct layouts (little-endian, 64 bytes each)
# magic ver depth in out status sq_head heartbeat errors tracing
DEV_HDR_FMT = struct.Struct("<IHHIIIIQII24x")
DEV_TRACING_OFFSET = 36
TRACING_NONE, TRACING_ARMING, TRACING_ON = 0, 1, 2
HOST_HDR_FMT = struct.Struct("<II56x")  # sq_tail cq_head
SQE_FMT = struct.Struct("<HHIIIIIQQ24x")  # op flags cid step layer count in_len arg0 arg1
CQE_FMT = struct.Struct("<IHHIIIIIIQ20xI")  # cid status op sq_head out_len r0-r3 r4 .. seq
ATTN_REC = np.dtype([("entry", "<u4"), ("weight", "<f4")])
OPEN_FMT = struct.Struct("<IIIIQ")  # n_entries entry_bytes capacity block_tokens window_base
CREATE_REC = np.dtype(
    [("entry", "<u4"), ("ctx", "<u4"), ("layer", "<u2"), ("head", "<u2"), ("block", "<u4")]
)
CTX_LEN_REC = np.dtype([("ctx", "<u4"), ("tokens", "<u4")])
VICTIM_REC = np.dtype([("entry", "<u4"), ("tier", "<u2"), ("priority_q16", "<u2")])

# --- trace area ------------------------------------------------------------------------
TRACE_MAGIC = 0x5254564B
# magic ver hdr_bytes n_entries n_batches entry_bytes capacity n_records seed block_tokens
TRACE_HDR_FMT = struct.Struct("<IHHIIIIIII28x")
EV_CREATE, EV_READ, EV_CTX_LEN = 0, 1, 2
TRACE_BATCH = np.dtype(
    [("step", "<u4"), ("layer", "<u2"), ("kind", "<u2"), ("count", "<u4"), ("offset", "<u4")]
)

# --- TCG plugin access ring ----------------------------------------------------------
ACC_MAGIC = 0x4343414B
ACC_HDR_FMT = struct.Struct("<IIQQQQQ16x")  # magic capacity head tail dropped seen armed
ACC_ARMED_OFFSET = 40
ACC_REC = np.dtype([("gpa", "<u8"), ("size_flags", "<u4"), ("vcpu", "<u4")])
ACC_STORE = 1 << 16

# The window the machine's CFMW lands at with -m 2G,maxmem=8G,slots=4 (the guest reports
# decoder0.0/start; the service checks it against this on OPEN).
WINDOW_BASE = 0x390000000
WINDOW_SIZE = 4 << 30

for _s in (DEV_HDR_FMT, HOST_HDR_FMT, SQE_FMT, CQE_FMT, TRACE_HDR_FMT, ACC_HDR_FMT):
    assert _s.size == 64, _s.format


def pattern(seed: int, ident: int, nbytes: int) -> bytes:
    """The byte pattern of ``kvcxl_pattern`` (kvcxl_ring.h): entry ``ident``'s bytes."""
    k = np.arange(nbytes // 8, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64((seed << 32 | ident) & 0xFFFFFFFFFFFFFFFF) * np.uint64(
            0x9E3779B97F4A7C15
        ) + k * np.uint64(0xD1B54A32D192ED03)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").tobytes()


def fnv1a_ids(ids: list[int] | NDArray) -> str:
    """The agent's victim hash: FNV-1a 64 over each id's 4 little-endian bytes, in order."""
    h = 1469598103934665603
    for i in ids:
        for s in range(4):
            h ^= (int(i) >> (8 * s)) & 0xFF
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def sq_offset(i: int) -> int:
    return RING_BASE + SQ + (i % DEPTH) * ENTRY


def cq_offset(i: int) -> int:
    return RING_BASE + CQ + (i % DEPTH) * ENTRY


def slot_in_offset(i: int) -> int:
    return RING_BASE + SLOTS + (i % DEPTH) * SLOT_STRIDE


def slot_out_offset(i: int) -> int:
    return slot_in_offset(i) + SLOT_IN
