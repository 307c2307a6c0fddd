"""The device-memory protocol between the guest agent and the firmware service.

The ring's command table (``RING_COMMANDS``) and its records come from the mailbox's
command table (:mod:`kvcxl.cxl.mailbox`) where a command means the same; the C
header ``qemu/guest/kvcxl_ring.h`` that the guest agent compiles is generated from this
module by :mod:`kvcxl.cxl.guest_header` (tests/test_qemu_ring.py checks that the committed
file is the generator's output, and compiles a program printing the header's opcodes,
sizes and offsets to compare them with these tables).
docs/qemu.md explains the protocol: layout, doorbell, ordering, error codes.

Addresses are device physical addresses (DPA): offsets into ``/dev/dax0.0`` in the
guest and into the media file on the host.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcxl.cxl import mailbox as mb

MiB = 1 << 20

# --- DPA map ---------------------------------------------------------------------------
RING_BASE = 0x000000
TRACE_BASE = 0x100000
TRACE_SIZE = 0x700000
XFER_BASE = 0x800000
XFER_H2G = XFER_BASE
XFER_G2H = XFER_BASE + 0x400000
XFER_BYTES = 0x10000
# The guest fuzz job's area, between the two transfer buffers: cases (host writes), then
# one result per case (the guest writes).
FUZZ_BASE = XFER_BASE + 0x100000
FUZZ_SIZE = 0x300000  # up to the guest-to-host buffer
# The guest widths job's bytes (loads and stores of every width), after the guest-to-host
# buffer: a boot traps or churns parts of it with --trap / --churn.
WIDTHS_BASE = XFER_G2H + 0x100000
WIDTHS_BYTES = 0x10000
KV_BASE = 0x1000000
# The guest bench job's copy block: the device's last 4 MiB (above the KV area).
BENCH_BYTES = 4 * MiB
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
DEV_OFF, DEV_READY, DEV_FAULT, DEV_STOPPED = 0, 1, 2, 3

# --- ring commands ------------------------------------------------------------------------
# One table: a row holds everything about one command, its handler included (a method of
# kvcxl.qemu.service.FirmwareService, by name, as a mailbox Command names its handler).
# Commands that mean what a mailbox vendor command means use that command's opcode and
# request records (kvcxl.cxl.mailbox.COMMANDS); the ring frames them
# differently (step and count in the SQE, decisions in the CQE and the output slot).
# Ring-only commands use command set C1h, which the mailbox does not use.
RING_SET = 0xC1


@dataclass(frozen=True)
class RingCommand:
    opcode: int
    name: str
    handler: str  # method of kvcxl.qemu.service.FirmwareService (a name: no service import)
    records: np.dtype | None  # input records (count in the SQE), None = none / fixed
    mailbox: mb.Command | None  # the mailbox command it shares opcode and records with
    doc: str

    @property
    def limit(self) -> int:
        """Records one command may carry: as many as fill the input slot."""
        return 0 if self.records is None else SLOT_IN // self.records.itemsize


def _own(command: int, name: str, records: np.dtype | None, doc: str) -> RingCommand:
    return RingCommand(RING_SET << 8 | command, name, f"op_{name.lower()}", records, None, doc)


def _shared(op: mb.Opcode, name: str, doc: str) -> RingCommand:
    cmd = mb.COMMANDS[op]
    return RingCommand(op, name, f"op_{name.lower()}", cmd.request.records, cmd, doc)


RING_COMMANDS: tuple[RingCommand, ...] = (
    _own(0x00, "NOP", None, "r4 = arg0"),
    _own(0x01, "OPEN", None, "starts a firmware session"),
    _own(
        0x02,
        "CREATE",
        mb.DESCRIBE_RECORD,
        "Describe Entries + Create Entries in one command (Describe Entries' records)",
    ),
    _own(0x03, "END_STEP", None, "the policy's end-of-step update"),
    _own(0x04, "POISON", None, "media error on arg0 DPA, arg1 B"),
    _own(0x05, "CLOSE", None, "ends the session"),
    _shared(mb.Opcode.VENDOR_ATTENTION_REPORT, "ATTN", "one layer of one decode step"),
    _shared(mb.Opcode.VENDOR_GET_STATS, "STATS", "JSON statistics in the output slot"),
    _shared(mb.Opcode.VENDOR_SET_CONTEXT_LENGTHS, "CTX_LEN", "context lengths in tokens"),
)
BY_OPCODE = {c.opcode: c for c in RING_COMMANDS}
OPCODES = {c.opcode: c.name for c in RING_COMMANDS}
_BY_NAME = {c.name: c for c in RING_COMMANDS}
OP_NOP = _BY_NAME["NOP"].opcode
OP_OPEN = _BY_NAME["OPEN"].opcode
OP_CREATE = _BY_NAME["CREATE"].opcode
OP_END_STEP = _BY_NAME["END_STEP"].opcode
OP_POISON = _BY_NAME["POISON"].opcode
OP_CLOSE = _BY_NAME["CLOSE"].opcode
OP_ATTN = _BY_NAME["ATTN"].opcode
OP_STATS = _BY_NAME["STATS"].opcode
OP_CTX_LEN = _BY_NAME["CTX_LEN"].opcode
ATTN_MAX = _BY_NAME["ATTN"].limit  # 1024: any response fits SLOT_OUT
CREATE_MAX = _BY_NAME["CREATE"].limit  # records per CREATE command
CTX_LEN_MAX = _BY_NAME["CTX_LEN"].limit

# Return codes: the mailbox's (the subset the ring uses).
RC_SUCCESS = int(mb.ReturnCode.SUCCESS)
RC_INVALID_INPUT = int(mb.ReturnCode.INVALID_INPUT)
RC_UNSUPPORTED = int(mb.ReturnCode.UNSUPPORTED)
RC_INTERNAL = int(mb.ReturnCode.INTERNAL_ERROR)
RC_INVALID_PAYLOAD_LENGTH = int(mb.ReturnCode.INVALID_PAYLOAD_LENGTH)
RC_NAMES = {
    RC_SUCCESS: "Success",
    RC_INVALID_INPUT: "Invalid Input",
    RC_UNSUPPORTED: "Unsupported",
    RC_INTERNAL: "Internal Error",
    RC_INVALID_PAYLOAD_LENGTH: "Invalid Payload Length",
}

# struct layouts (little-endian, 64 bytes each); each ``*_FIELDS`` names its format's items
# in order (padding unnamed), for the generated C header (kvcxl.cxl.guest_header).
DEV_HDR_FMT = struct.Struct("<IHHIIIIQII24x")
DEV_HDR_FIELDS = (
    "magic", "version", "depth", "slot_in", "slot_out", "status", "sq_head", "heartbeat",
    "errors", "tracing",
)  # fmt: skip
DEV_TRACING_OFFSET = 36
TRACING_NONE, TRACING_ARMING, TRACING_ON = 0, 1, 2
HOST_HDR_FMT = struct.Struct("<II56x")
HOST_HDR_FIELDS = ("sq_tail", "cq_head")
SQE_FMT = struct.Struct("<HHIIIIIQQ24x")
SQE_FIELDS = ("opcode", "flags", "cid", "step", "layer", "count", "in_len", "arg0", "arg1")
CQE_FMT = struct.Struct("<IHHIIIIIIQ20xI")
CQE_FIELDS = (
    "cid", "status", "opcode", "sq_head", "out_len", "r0", "r1", "r2", "r3", "r4", "seq",
)  # fmt: skip
# The CQE without its last field, ``seq``: the firmware writes the fields, then ``seq``.
CQE_BODY_FMT = struct.Struct(CQE_FMT.format[:-1])
CQE_SEQ_OFFSET = CQE_BODY_FMT.size
ATTN_REC = mb.ATTENTION_RECORD  # also the trace area's READ record
OPEN_FMT = struct.Struct("<IIIIQ")
OPEN_FIELDS = ("n_entries", "entry_bytes", "capacity", "block_tokens", "window_base")
CREATE_REC = mb.DESCRIBE_RECORD
CTX_LEN_REC = mb.LENGTH_RECORD
VICTIM_REC = np.dtype([("entry", "<u4"), ("tier", "<u2"), ("priority_q16", "<u2")])

# --- trace area ------------------------------------------------------------------------
TRACE_MAGIC = 0x5254564B
TRACE_HDR_FMT = struct.Struct("<IHHIIIIIII28x")
TRACE_HDR_FIELDS = (
    "magic", "version", "hdr_bytes", "n_entries", "n_batches", "entry_bytes", "capacity",
    "n_records", "seed", "block_tokens",
)  # fmt: skip
EV_CREATE, EV_READ, EV_CTX_LEN = 0, 1, 2
TRACE_BATCH = np.dtype(
    [("step", "<u4"), ("layer", "<u2"), ("kind", "<u2"), ("count", "<u4"), ("offset", "<u4")]
)

# --- guest fuzz area (qemu/guest_fuzz.py; the agent's fuzz job) -------------------------
FUZZ_MAGIC = 0x5A46564B  # "KVFZ"
FUZZ_HDR_FMT = struct.Struct("<IIII48x")
FUZZ_HDR_FIELDS = ("magic", "n_cases", "hdr_bytes", "results")  # results: offset in the area
# One ring command as the guest submits it: its payload (``length`` bytes at ``offset``
# in the area) goes to the input slot, ``in_len`` to the SQE (they differ when in_len
# is past the slot).
FUZZ_CASE = np.dtype(
    [("op", "<u2"), ("pad", "<u2"), ("step", "<u4"), ("count", "<u4"), ("in_len", "<u4"),
     ("arg0", "<u8"), ("arg1", "<u8"), ("offset", "<u4"), ("length", "<u4")]
)  # fmt: skip
# What the guest saw: the completion's status and out_len, and the bytes it found changed
# outside the completion and the out_len bytes of its output slot.
FUZZ_RESULT = np.dtype(
    [("status", "<u2"), ("done", "<u2"), ("out_len", "<u4"), ("stray", "<u4"), ("pad", "<u4")]
)

# --- TCG plugin access ring ----------------------------------------------------------
ACC_MAGIC = 0x4343414B
ACC_HDR_FMT = struct.Struct("<IIQQQQQ16x")
ACC_HDR_FIELDS = ("magic", "capacity", "head", "tail", "dropped", "seen", "armed")
ACC_ARMED_OFFSET = 40
ACC_REC = np.dtype([("gpa", "<u8"), ("size_flags", "<u4"), ("vcpu", "<u4")])
ACC_STORE = 1 << 16

# --- CXL.mem request ring (patched QEMU <-> the kvcxl device, shared memory) ------------
# A file both map (QEMU's ``kvcxl-ring=FILE``): a header, then DEPTH records.  QEMU writes
# a request into record ``tail % DEPTH`` and publishes ``req_tail = tail + 1``; the device
# answers in the same record and publishes ``req_head``.  Each index sits on its own cache
# line.  A side that finds nothing spins, then sleeps in futex(2) on the index it waits
# for after raising its ``*_sleep`` word; the other side wakes it only when that word is
# set, so a busy link makes no system call (docs/qemu.md, "The CXL.mem request ring").
# These tables are the only definition: the C header is generated from them
# (kvcxl.qemu.qemu_patch.render_header) and kvcxl.qemu.memring reads them.
MR_MAGIC = 0x514D524B  # "KRMQ"
MR_VERSION = 1
MR_DEPTH = 16
MR_REC_BYTES = 128
MR_HDR = {  # byte offsets of the header's u32 fields
    "magic": 0, "version": 4, "depth": 8, "rec_bytes": 12,
    "fault": 16,  # the device stopped serving: nonzero (a bad index), QEMU fails the link
    "req_tail": 64,  # QEMU: requests published
    "req_head": 128,  # device: requests answered
    "dev_sleep": 192,  # device: asleep in futex on req_tail
    "host_sleep": 256,  # QEMU: asleep in futex on req_head
}  # fmt: skip
MR_RECORDS = 4096  # offset of record 0
MR_BYTES = MR_RECORDS + MR_DEPTH * MR_REC_BYTES
MR_REC = {  # byte offsets inside one record: the request, then the device's answer
    "op": 0,  # u16 MR_OP_*
    "flags": 2,  # u16, 0
    "seq": 4,  # u32, the request's index (tail) for the device to check
    "addr": 8,  # u64, the line's address as CXL.mem's Addr (DPA >> 6 under decoder 0)
    "byte_enable": 16,  # u64, MemWrPtl's byte enables (0 for a read)
    "status": 24,  # u16 MR_ST_*, written by the device
    "data": 32,  # 64 bytes: the line (read: the answer; write: bytes under byte_enable)
}
MR_REQ_FMT = struct.Struct("<HHIQQ")  # op flags seq addr byte_enable, at MR_REC["op"]
MR_OP_READ, MR_OP_WRITE = 1, 2  # MemRd, MemWrPtl
MR_ST_OK, MR_ST_POISON, MR_ST_REFUSED = 0, 1, 2  # REFUSED: a bad record, one access fails
MR_FAULT_BAD_INDEX = 1  # req_tail ran more than DEPTH ahead of req_head
# Waiting, each side: a busy spin (an answer, or the next request of a burst, comes
# within microseconds), then futex.  No sched_yield in the spin: on this loaded machine
# a yielding spinner gave its CPU away for whole time slices (one boot: trapped loads
# at 84 µs p50, 2.4 ms p95); a thread woken from futex is scheduled sooner.  Longer
# busy spins did worse too (100 µs / 200 µs: 340 µs p50 in one boot): two spinners of
# ours take both cores from the guest's vCPU (docs/qemu.md, the request ring's table).
MR_HOST_SPIN_NS = 20_000  # QEMU: busy spin for an answer, then it sleeps
MR_DEVICE_SPIN_S = 50e-6  # the device: busy spin after its last request, then it sleeps
MR_WAIT_NS = 1_000_000  # each futex sleep is bounded: a lost wake-up costs at most this

# The window the machine's CFMW lands at with -m 2G,maxmem=8G,slots=4 (the guest reports
# decoder0.0/start; the service checks it against this on OPEN).
WINDOW_BASE = 0x390000000
WINDOW_SIZE = 4 << 30

assert MR_REC["op"] == 0 and MR_REQ_FMT.size == MR_REC["status"]  # one unpack at the record
assert MR_REC["data"] + 64 <= MR_REC_BYTES
assert CQE_SEQ_OFFSET + 4 == CQE_FMT.size  # seq is the last u32 of the CQE
for _s in (DEV_HDR_FMT, HOST_HDR_FMT, SQE_FMT, CQE_FMT, TRACE_HDR_FMT, ACC_HDR_FMT, FUZZ_HDR_FMT):
    assert _s.size == 64, _s.format


def areas(capacity: int) -> dict[str, tuple[int, int]]:
    """The DPA areas a boot's report counts the traffic of (``(dpa, bytes)``, by name):
    the ring, the two transfer buffers, the widths job's bytes and the bench job's block."""
    return {
        "ring": (RING_BASE, TRACE_BASE - RING_BASE),
        "xfer_h2g": (XFER_H2G, XFER_BYTES),
        "xfer_g2h": (XFER_G2H, XFER_BYTES),
        "widths": (WIDTHS_BASE, WIDTHS_BYTES),
        "bench_block": (capacity - BENCH_BYTES, BENCH_BYTES),
    }


def pattern(seed: int, ident: int, nbytes: int) -> bytes:
    """The byte pattern of ``kvcxl_pattern`` (qemu/guest/kvcxl_pattern.h): entry ``ident``'s
    bytes."""
    k = np.arange(nbytes // 8, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64((seed << 32 | ident) & 0xFFFFFFFFFFFFFFFF) * np.uint64(
            0x9E3779B97F4A7C15
        ) + k * np.uint64(0xD1B54A32D192ED03)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").tobytes()


def fnv1a_bytes(data: bytes) -> str:
    """The agent's hash: FNV-1a 64 over the bytes, in order."""
    h = 1469598103934665603
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def fnv1a_ids(ids: list[int] | NDArray) -> str:
    """The agent's victim hash: FNV-1a 64 over each id's 4 little-endian bytes, in order."""
    return fnv1a_bytes(b"".join(int(i).to_bytes(4, "little") for i in ids))


def sq_offset(i: int) -> int:
    return RING_BASE + SQ + (i % DEPTH) * ENTRY


def cq_offset(i: int) -> int:
    return RING_BASE + CQ + (i % DEPTH) * ENTRY


def slot_in_offset(i: int) -> int:
    return RING_BASE + SLOTS + (i % DEPTH) * SLOT_STRIDE


def slot_out_offset(i: int) -> int:
    return slot_in_offset(i) + SLOT_IN


# The same offsets by slot (i % DEPTH), looked up on the firmware's per-command path.
SQ_OFFSETS = tuple(sq_offset(k) for k in range(DEPTH))
CQ_OFFSETS = tuple(cq_offset(k) for k in range(DEPTH))
SLOT_IN_OFFSETS = tuple(slot_in_offset(k) for k in range(DEPTH))
SLOT_OUT_OFFSETS = tuple(slot_out_offset(k) for k in range(DEPTH))
