"""Fuzzing the command ring through its shared memory, with a model of its return codes.

The ring is a real interface: the guest (here, this process through the media file's
mapping, as :class:`kvcxl.qemu.ring_client.RingClient` does) writes a submission entry and
its payload, rings the doorbell, and the firmware service answers in the completion queue.
Each case starts from a valid command for the session's state and is **mutated** (another
opcode, a count or in_len at or past its limit, a step out of order, a flipped payload bit,
an entry id or field at or past its bound, a poison range at the media's end) until it
differs: no unmodified case is counted.  A model of the ring's rules (docs/qemu.md, "The
ring", "Return codes") predicts the return code and follows the session's state; it is
told which firmware answers (:data:`FIRMWARES`: the ring-only session, the device
emulator, the patched QEMU's memory-path device, which is rung by the CXL.mem write of
its doorbell, as QEMU forwards the guest's store) and adds that firmware's own rule where
the docs give one.  Counted: crashes (Internal Error, the service raising, a doorbell
write that completed before its answer), wrong return codes, and bytes changed outside
the command's own completion entry, output slot and the device header.
"""

from __future__ import annotations

import math
import random
import struct
from collections import Counter
from pathlib import Path

import numpy as np

from kvcxl.cxl import mem as cxlmem
from kvcxl.cxl import ring as L
from kvcxl.emu.device.front import MAX_CONTEXTS, MAX_INDEX_CELLS, index_extents
from kvcxl.emu.device.service import MEM as MEM_FRAME

from . import ring_device
from .ring_client import RingClient, mem_doorbell
from .service import FirmwareService

OK, II, IPL, UNS, INT = (
    L.RC_SUCCESS,
    L.RC_INVALID_INPUT,
    L.RC_INVALID_PAYLOAD_LENGTH,
    L.RC_UNSUPPORTED,
    L.RC_INTERNAL,
)
MIB = 1 << 20
# The firmware behind the ring: the service's own session (stock QEMU,
# --no-device-emulator), the service with one device emulator per OPEN … CLOSE (stock
# QEMU, the default), the memory-path device of the patched QEMU (the default QEMU).
FIRMWARES = ("ring-only", "device", "memory-device")


def firmware_for(qemu: str, device_emulator: bool) -> str:
    """The firmware a boot with ``--qemu`` and ``--[no-]device-emulator`` puts behind the
    ring (ValueError for the one pair no boot runs)."""
    if qemu == "kvcxl":
        if not device_emulator:
            raise ValueError("the ring-only firmware needs --qemu stock: with the patched "
                             "QEMU the device on the memory path answers the ring")  # fmt: skip
        return "memory-device"
    return "device" if device_emulator else "ring-only"


# (records, limit) of each command with input records: its row of the ring table
SIZES = {c.opcode: (c.records, c.limit) for c in L.RING_COMMANDS if c.records is not None}


class RingModel:
    """The session state the ring's rules depend on, and the return code they require."""

    def __init__(self, media_size: int, firmware: str = "ring-only") -> None:
        self.size = media_size
        self.firmware = firmware
        self.opened = False
        self.n = self.created = 0
        self.bt = 16
        self.step: int | None = None
        self.extents: dict = {}
        self.cells = 0

    def expect(self, op: int, step: int, count: int, in_len: int, payload: bytes, a0: int, a1: int):
        if in_len > L.SLOT_IN:
            return IPL
        if op not in L.OPCODES:
            return UNS
        if op in (L.OP_NOP, L.OP_STATS):
            return OK
        if op == L.OP_CLOSE:
            self.opened, self.step = False, None
            return OK
        if op == L.OP_POISON:
            bad = a1 == 0 or a1 % 64 or a0 % 64 or a0 + a1 > self.size
            return II if bad else OK
        if op == L.OP_OPEN:
            if len(payload) != L.OPEN_FMT.size:
                return IPL
            n, eb, cap, bt, _base = L.OPEN_FMT.unpack(payload)
            if n == 0 or cap == 0 or bt == 0 or eb == 0 or eb % 64:
                return II
            if L.KV_BASE + n * eb > self.size:
                return II
            if self.firmware == "device" and (eb & (eb - 1) or eb > 2 * MIB):
                return II  # the device emulator pages each entry: a power of two
            self.opened, self.n, self.created, self.bt, self.step = True, n, 0, bt, None
            self.extents, self.cells = {}, 0
            return OK
        if not self.opened:
            return II
        if op == L.OP_END_STEP:
            return OK if self.step is not None and step == self.step else II
        dtype, limit = SIZES[op]
        if count > limit or count * dtype.itemsize != len(payload):
            return IPL
        rec = np.frombuffer(payload, dtype, count=count)
        if op == L.OP_CREATE:
            ids = rec["entry"].astype(np.int64)
            if not np.array_equal(ids, np.arange(self.created, self.created + count)):
                return II
            if self.created + count > self.n:
                return II
            limits = (("ctx", MAX_CONTEXTS - 1), ("layer", 0x7FFF), ("head", 0x7FFF),
                      ("block", 0x7FFFFFFF // self.bt))  # fmt: skip
            if any(count and int(rec[f].max()) > hi for f, hi in limits):
                return II
            cols = [rec[f].astype(np.int64) for f in ("ctx", "layer", "head", "block")]
            grown, cells = index_extents(self.extents, self.cells, *cols)
            if cells > MAX_INDEX_CELLS:
                return II
        elif op == L.OP_CTX_LEN:
            if count and (
                int(rec["ctx"].max()) >= MAX_CONTEXTS or int(rec["tokens"].max()) > 1 << 40
            ):
                return II
        else:  # ATTN
            if count and int(rec["entry"].max()) >= self.created:
                return II
            w = rec["weight"].astype(np.float64)
            if count and (not all(math.isfinite(x) for x in w) or w.min() < 0 or w.max() > 1):
                return II
        if self.step is not None and step < self.step:
            return II
        self.step = step
        if op == L.OP_CREATE:
            self.created += count
            self.extents.update(grown)
            self.cells = cells
        return OK


class CaseMaker:
    """Mutated ring commands, each with the return code the model predicts for it: the
    cases of the in-process fuzzer and of the guest agent's ``fuzz`` job alike."""

    def __init__(self, media_size: int, seed: int = 0, firmware: str = "ring-only") -> None:
        self.model = RingModel(media_size, firmware)
        self.rng = random.Random(seed)

    # --- valid commands for the model's state ------------------------------------------------
    def _valid(self) -> tuple[int, int, int, bytes, int, int]:
        r, m = self.rng, self.model
        step = m.step or 0
        if not m.opened or r.random() < 0.03:
            n = r.choice([8, 64, 512])
            eb = r.choice([64, 64, 4096])
            return L.OP_OPEN, 0, 0, L.OPEN_FMT.pack(n, eb, r.choice([2, 8, 32]), 16, 0), 0, 0
        choice = r.random()
        if choice < 0.25 and m.created < m.n:
            k = min(r.randrange(1, 9), m.n - m.created)
            rec = np.zeros(k, L.CREATE_REC)
            rec["entry"] = np.arange(m.created, m.created + k)
            rec["ctx"], rec["layer"], rec["block"] = r.randrange(4), r.randrange(4), 100
            return L.OP_CREATE, step, k, rec.tobytes(), 0, 0
        if choice < 0.6 and m.created:
            k = r.randrange(1, 17)
            rec = np.zeros(k, L.ATTN_REC)
            rec["entry"] = [r.randrange(m.created) for _ in range(k)]
            rec["weight"] = [r.random() for _ in range(k)]
            return L.OP_ATTN, step + r.randrange(2), k, rec.tobytes(), 0, 0
        if choice < 0.7:
            rec = np.zeros(1, L.CTX_LEN_REC)
            rec["ctx"], rec["tokens"] = r.randrange(4), r.randrange(1, 4096)
            return L.OP_CTX_LEN, step, 1, rec.tobytes(), 0, 0
        if choice < 0.8 and m.step is not None:
            return L.OP_END_STEP, m.step, 0, b"", 0, 0
        if choice < 0.9:
            return L.OP_POISON, 0, 0, b"", L.KV_BASE + 64 * r.randrange(1024), 64
        return r.choice([L.OP_NOP, L.OP_STATS, L.OP_CLOSE]), 0, 0, b"", r.randrange(1 << 16), 0

    def _mutate(self, case: tuple) -> tuple[tuple, str]:
        r = self.rng
        op, step, count, payload, a0, a1 = case
        in_len = len(payload)
        how = r.choice(["op", "count", "in_len", "step", "flip", "field", "arg"])
        if how == "op":
            op = r.choice([*L.OPCODES, 0, 0xFFFF, r.randrange(1 << 16)])
        elif how == "count":
            limit = SIZES.get(op, (None, 1))[1]
            count = r.choice([0, count + 1, max(count - 1, 0), limit, limit + 1, (1 << 32) - 1])
        elif how == "in_len":
            in_len = r.choice([in_len + 1, max(in_len - 1, 0), L.SLOT_IN, L.SLOT_IN + 1])
            payload = (payload + bytes(L.SLOT_IN + 1))[: min(in_len, L.SLOT_IN)]
        elif how == "step":
            step = r.choice([max(step - 1, 0), step + 1, 0, (1 << 32) - 1])
        elif how == "flip" and payload:
            b = bytearray(payload)
            i = r.randrange(len(b))
            b[i] ^= 1 << r.randrange(8)
            payload = bytes(b)
        elif how == "field" and op == L.OP_OPEN and len(payload) == L.OPEN_FMT.size:
            fields = list(L.OPEN_FMT.unpack(payload))  # n, entry_bytes, capacity, block_tokens
            k = r.randrange(4)
            fields[k] = r.choice(
                [[0, 1 << 31], [0, 96, 65, 4 * MIB, 2 * MIB], [0, 1 << 31], [0, 1 << 31]][k]
            )
            payload = L.OPEN_FMT.pack(*fields)
        elif how == "field" and op in SIZES and count:
            dtype = SIZES[op][0]
            rec = np.frombuffer(payload, dtype, count=count).copy()
            name = r.choice(dtype.names)
            hi = {"ctx": MAX_CONTEXTS, "layer": 0x8000, "head": 0x8000, "tokens": (1 << 40) + 1,
                  "entry": self.model.created, "block": 0x7FFFFFFF // 16 + 1,
                  "weight": float("nan")}[name]  # fmt: skip
            rec[name][r.randrange(count)] = (
                r.choice([hi, max(hi - 1, 0)])
                if name != "weight"
                else r.choice([float("nan"), float("inf"), -1.0, 2.0])
            )
            payload = rec.tobytes()
        else:
            how = "arg"
            a0 = r.choice([self.model.size - 64, self.model.size, 3, (1 << 64) - 64])
            a1 = r.choice([0, 64, 128, 100])
        return (op, step, count, payload, a0, a1, in_len), how

    def next(self) -> tuple[tuple, str, int]:
        """``((op, step, count, payload, arg0, arg1, in_len), mutation, expected code)``:
        a valid command for the model's state, mutated until it differs."""
        base = self._valid()
        mutated, how = self._mutate(base)
        while mutated[:6] == base and mutated[6] == len(base[3]):
            mutated, how = self._mutate(base)  # every counted case is mutated
        op, step, count, payload, a0, a1, in_len = mutated
        step &= 0xFFFFFFFF  # the SQE's fields are 32 and 64 bits
        count &= 0xFFFFFFFF
        a0 &= (1 << 64) - 1
        a1 &= (1 << 64) - 1
        want = self.model.expect(op, step, count, in_len, payload, a0, a1)
        return (op, step, count, payload, a0, a1, in_len), how, want


class _InProcessLink:
    """The device's end of QEMU's link, without the socket: a CXL.mem request goes to
    the engine as the frame QEMU sends (what :func:`ring_client.mem_doorbell` needs)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def mem(self, msg):
        kind, body = self.engine.handle(MEM_FRAME, cxlmem.encode(msg))
        if kind != MEM_FRAME:
            raise RuntimeError(body.decode(errors="replace"))
        return cxlmem.decode(body) if body else None


class RingFuzzer:
    """Fuzzes one firmware behind the ring on ``media``: ``firmware`` is one of
    :data:`FIRMWARES` (the ring-only service, the service with the device emulator, or
    the memory-path device of a patched QEMU, rung by its doorbell's CXL.mem write)."""

    def __init__(
        self, media: str | Path, seed: int = 0, policy: str = "ema", firmware: str = "ring-only"
    ) -> None:
        if firmware not in FIRMWARES:
            raise ValueError(f"firmware = {firmware!r}: one of {', '.join(FIRMWARES)}")
        self.firmware = firmware
        self.engine = None
        doorbell = None
        if firmware == "memory-device":
            self.engine, self.fw = ring_device.build(
                media, Path(f"{media}.page-state"), policy=policy
            )
            doorbell = mem_doorbell(_InProcessLink(self.engine))
        else:
            self.fw = FirmwareService(media, policy=policy, device=firmware == "device")
        self.last_log: str | None = None  # what the firmware logged for the current case
        log = self.fw._log
        self.fw._log = lambda msg: (setattr(self, "last_log", msg), log(msg))[1]
        self.cl = RingClient(media, heartbeat_timeout=1.0, doorbell=doorbell)
        self.cl.wait_ready(timeout=5)
        self.maker = CaseMaker(self.fw.size, seed, firmware)
        self.model = self.maker.model
        self.cases = self.crashes = self.wrong = self.changed_bytes = 0
        self.coverage: Counter[str] = Counter()
        self.mutations: Counter[str] = Counter()
        self.examples: list[str] = []

    def close(self) -> None:
        self.cl.close()
        if self.engine is not None:
            self.engine.device.close()

    # --- one case -------------------------------------------------------------------------------
    def case(self) -> None:
        (op, step, count, payload, a0, a1, in_len), how, want = self.maker.next()
        self.cases += 1
        self.mutations[how] += 1
        cl = self.cl
        i = cl.sq_tail
        o = L.slot_in_offset(i)
        cl.mm[o : o + len(payload)] = payload
        sqe = L.SQE_FMT.pack(op, 0, cl.cid, step & 0xFFFFFFFF, 0, count & 0xFFFFFFFF,
                             in_len, a0 & (2**64 - 1), a1 & (2**64 - 1))  # fmt: skip
        cl.mm[L.sq_offset(i) : L.sq_offset(i) + L.ENTRY] = sqe
        cl.cid += 1
        cl.sq_tail = (i + 1) & 0xFFFFFFFF
        before = self._snapshot()
        self.last_log = None
        try:
            if cl.doorbell is not None:  # the memory-path device: served on the doorbell
                cl.doorbell(cl.sq_tail)
                if not cl.done(i):
                    raise RuntimeError("the doorbell write completed before its answer")
                c = cl.wait(i)
            else:
                struct.pack_into("<I", cl.mm, L.RING_BASE + L.HOST_HDR, cl.sq_tail)
                c = cl.wait(i, self.fw.poll_once)
        except Exception as exc:  # the service raised out of its poll loop
            self.crashes += 1
            self._note(f"crash: op {op:#06x} ({how}): {type(exc).__name__}: {exc}")
            return
        after = self._snapshot()
        allowed = [
            (L.RING_BASE + L.DEV_HDR, L.RING_BASE + L.HOST_HDR + 8),
            (L.cq_offset(i), L.cq_offset(i) + L.ENTRY),
            (L.slot_out_offset(i), L.slot_out_offset(i) + c.out_len),
        ]
        stray = [
            x for x in np.flatnonzero(before != after) if not any(a <= x < b for a, b in allowed)
        ]
        self.changed_bytes += len(stray)
        name = L.OPCODES.get(op, "unknown")
        self.coverage[f"{name} -> {L.RC_NAMES.get(c.status, hex(c.status))}"] += 1
        if c.status == INT:
            self.crashes += 1
            self._note(f"crash: {name} ({how}): {self.last_log}")
        elif c.status != want:
            self.wrong += 1
            self._note(
                f"wrong: {name} ({how}) step {step} count {count} in_len {in_len}: got "
                f"{L.RC_NAMES.get(c.status)}, want {L.RC_NAMES.get(want)}; {self.last_log}"
            )
            self._resync()

    def _snapshot(self) -> np.ndarray:
        """The ring (headers, queues, slots) and the first MiB of KV space, as one array
        indexed by offset within it (KV bytes after the ring's MiB)."""
        mm = self.fw.mm
        return np.frombuffer(
            bytes(mm[: L.TRACE_BASE]) + bytes(mm[L.KV_BASE : L.KV_BASE + MIB]), np.uint8
        )

    def _resync(self) -> None:
        """After a wrong answer the model's state may differ from the service's: re-open."""
        self.model.opened = False

    def _note(self, what: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(what)


def run(media: str | Path, cases: int, *, seed: int = 0, firmware: str = "ring-only") -> dict:
    """Fuzz the ``firmware`` behind the ring on ``media`` (a file of at least 20 MiB;
    a multiple of 256 MiB for the memory-path device)."""
    f = RingFuzzer(media, seed, firmware=firmware)
    try:
        for _ in range(cases):
            f.case()
    finally:
        f.close()
    return {
        "interface": "the command ring in device memory",
        "firmware": firmware,
        "cases": f.cases,
        "unmodified_cases": 0,
        "crashes": f.crashes,
        "wrong_return_codes": f.wrong,
        "changed_bytes": f.changed_bytes,
        "service_errors_counted": f.fw.errors,
        "mutations": dict(f.mutations),
        "coverage": dict(sorted(f.coverage.items())),
        "examples": f.examples,
        "evidence": "Measured",
    }
