"""The firmware service: polls the command ring in device memory and answers with the
decisions of the policy engine in :mod:`kvcxl.firmware`.

The device media is a file that QEMU maps as the Type-3 device's volatile memory
(``memory-backend-file,share=on``); this process maps the same file, so a guest store
to the ring is a store into this mapping.  The service owns the device header line
(status, heartbeat, consumed index) and the completion queue; the guest owns the
doorbell line and the submission queue (docs/qemu.md, "The ring").

The firmware the guest talks to.  With ``--device`` (what ``kvcxl qemu boot`` runs)
each OPEN … CLOSE is served by a :class:`kvcxl.emu.device.device.Type3Device` with
host-managed entries, in this process: the device emulator *is* the firmware, every
answer on the ring (admitted entries, victims with their tiers and priorities,
prefetch hints, hits) is a decision of the device's firmware session, and this module
is only the ring's transport (validation of the ring's records, encoding of the
answers, statistics).  A device error is answered to the guest with the ring's return
code, logged and counted (``device_errors``).  Without ``--device`` (stock, ring-only
mode) the service drives a :class:`kvcxl.firmware.session.FirmwareSession` itself —
the same session the simulator and the device drive, so either way the same trace
gives the same victims, placements and prefetch candidates.

Run as ``python -m kvcxl.qemu.service --media FILE --out STATS.json``; SIGTERM stops
it and writes the statistics.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import signal
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvcxl.cxl import mailbox
from kvcxl.cxl import ring as L
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.errors import RequestError
from kvcxl.emu.device.front import MAX_CONTEXTS, MAX_INDEX_CELLS, index_extents
from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.session import FirmwareSession
from kvcxl.firmware.table import EntryTable

HEARTBEAT_S = 0.005
HINTS_MAX = 64  # prefetch hints per ATTN response (touches used as sources, candidates sent)

# The per-command path's names, looked up once (FirmwareService._serve).
_SQE_UNPACK = L.SQE_FMT.unpack_from
_CQE_BODY_PACK = L.CQE_BODY_FMT.pack_into
_U32_PACK = struct.Struct("<I").pack_into
_BY_OPCODE = L.BY_OPCODE
_NO_RESULT = (0, 0, 0, 0, 0)


class RingError(Exception):
    """A command the firmware refuses; carries the CXL return code."""

    def __init__(self, rc: int, why: str) -> None:
        super().__init__(why)
        self.rc = rc


class FirmwareService:
    def __init__(
        self,
        media: str | Path,
        *,
        policy: str = "ema",
        config: object = None,
        plugin_ring: str | Path | None = None,
        record_victims: bool = True,
        device: bool = False,
        memory_device: Type3Device | None = None,
        mode: str = "float",
    ) -> None:
        self.path = Path(media)
        self.fd = os.open(self.path, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        if self.size < L.KV_BASE + (4 << 20):
            raise ValueError(f"media file {media} is {self.size} B: too small for the layout")
        self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED)
        self.policy_name = policy
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r}: must be 'float' or 'int'")
        self.mode = mode  # the EMA's arithmetic: float, or the Q0.16 contract (the RTL's)
        self.config = config or PolicyConfig()
        self.record_victims = record_victims
        self.plugin_path = Path(plugin_ring) if plugin_ring else None
        self.acc: mmap.mmap | None = None
        self.tracing = L.TRACING_ARMING if self.plugin_path else L.TRACING_NONE
        # (patched QEMU) the kvcxl device on the memory path, in this process: it answers
        # the ring too (Type3Device.open_kv), and moves each victim's KV block to the tier
        # placement chose, so the guest's next read of it goes there.
        self.memory_device = memory_device
        self.use_device = device or memory_device is not None  # the firmware is a device
        self.device = None  # the open session's device (with use_device)
        self.device_errors = 0
        self.doorbells = 0  # commands served on a doorbell write, not found by polling
        self.sq_head = 0
        self.bad_tail: int | None = None  # a doorbell refused as more than a ring ahead
        self.heartbeat = 0
        self.errors = 0
        # Plain dicts (a Counter's increment costs twice a dict's, on every command).
        self.commands: dict[str, int] = {}  # served, by opcode name
        self.status_counts: dict[str, int] = {}  # completions, by return code name
        self.error_log: list[str] = []
        self.poison: list[tuple[int, int]] = []
        self.poisoned_entries: set[int] = set()
        self.window_base: int | None = None
        self.sessions: list[dict] = []  # one per OPEN … CLOSE, archived
        self.plugin_reads = self.plugin_writes = self.plugin_outside = 0
        self.plugin_dropped = self.plugin_records = 0
        self.fw = None
        self._reset_state()
        self._init_ring()

    # --- state ---------------------------------------------------------------------------
    @property
    def cache(self):
        return None if self.fw is None else self.fw.cache

    @property
    def table(self):
        return None if self.fw is None else self.fw.table

    @property
    def audit(self):
        return None if self.fw is None else self.fw.audit

    @property
    def time(self) -> int:
        return 0 if self.fw is None else self.fw.time

    def _reset_state(self) -> None:
        if self.device is not None and self.device is not self.memory_device:
            self.device.close()
        self.device = None
        self.fw = None  # the firmware session of the open OPEN … CLOSE (the device's, if any)
        self.n_entries = 0
        self.entry_bytes = 0
        self.step: int | None = None
        self.victims: list[int] = []
        self.victim_tiers = Counter()
        self.hints_sent = 0
        self.accessed: np.ndarray | None = None  # plugin-seen CXL.mem reads per entry
        self.extents: dict[int, tuple[int, int, int]] = {}  # ring-only: the index's extent
        self.index_cells = 0

    def _init_ring(self) -> None:
        """Zero the ring, then publish the header with status READY (written last)."""
        self.mm[L.RING_BASE : L.RING_BASE + L.SLOTS] = bytes(L.SLOTS)
        self._write_dev_hdr(L.DEV_OFF)
        self._write_dev_hdr(L.DEV_READY)

    def _write_dev_hdr(self, status: int) -> None:
        self.status = status
        L.DEV_HDR_FMT.pack_into(
            self.mm,
            L.RING_BASE + L.DEV_HDR,
            L.RING_MAGIC,
            L.RING_VERSION,
            L.DEPTH,
            L.SLOT_IN,
            L.SLOT_OUT,
            status,
            self.sq_head & 0xFFFFFFFF,
            self.heartbeat,
            self.errors,
            self.tracing,
        )

    def beat(self) -> None:
        self.heartbeat += 1
        struct.pack_into("<Q", self.mm, L.RING_BASE + L.DEV_HDR + 24, self.heartbeat)

    # --- the poll loop ---------------------------------------------------------------------
    def poll_once(self) -> int:
        """Serve every submitted command; returns how many."""
        tail, _cq_head = L.HOST_HDR_FMT.unpack_from(self.mm, L.RING_BASE + L.HOST_HDR)
        pending = (tail - self.sq_head) & 0xFFFFFFFF
        if pending > L.DEPTH:
            # The guest's tail is more than a ring ahead: serving it would replay stale
            # slots (up to 2^32 of them).  Refuse it, once per bad tail, until it is sane.
            if tail != self.bad_tail:
                self.bad_tail = tail
                self.errors += 1
                _count(self.status_counts, "BAD_DOORBELL")
                self._log(f"doorbell tail {tail} is {pending} ahead of head {self.sq_head}")
                struct.pack_into("<I", self.mm, L.RING_BASE + L.DEV_HDR + 32, self.errors)
            return 0
        n, head, serve = 0, self.sq_head, self._serve
        while (head & 0xFFFFFFFF) != tail:
            serve(head)
            head += 1
            self.sq_head = head
            n += 1
        if n:
            struct.pack_into("<I", self.mm, L.RING_BASE + L.DEV_HDR + 20, self.sq_head & 0xFFFFFFFF)
        if self.plugin_path is not None:
            self.drain_plugin()
        return n

    def run(self, stop: Callable[[], bool], idle_sleep: float = 5e-5) -> None:
        """Poll until ``stop()`` is true: busy while commands flow, napping when idle."""
        last_beat = 0.0
        idle = 0
        while not stop():
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_S:
                self.beat()
                last_beat = now
            if self.poll_once():
                idle = 0
            else:
                idle += 1
                time.sleep(idle_sleep if idle < 2000 else 1e-3)

    def stop(self) -> None:
        self._write_dev_hdr(L.DEV_STOPPED)

    def doorbell(self) -> None:
        """The guest wrote the doorbell line (a trapped CXL.mem write reaching the device):
        serve what it submitted before that write completes."""
        self.doorbells += 1
        self.poll_once()

    def fault(self, why: str) -> None:
        """The ring cannot be served: the guest's next wait sees status FAULT."""
        self._log(why)
        self.errors += 1
        self._write_dev_hdr(L.DEV_FAULT)

    # --- commands --------------------------------------------------------------------------
    def _serve(self, i: int) -> None:
        # The per-command path (a pipelined batch runs it DEPTH times per doorbell): one
        # unpack of the SQE, offsets by slot, the CQE's fields in one write, then its seq.
        mm = self.mm
        k = i % L.DEPTH
        op, _flags, cid, step, layer, count, in_len, arg0, arg1 = _SQE_UNPACK(mm, L.SQ_OFFSETS[k])
        cmd = _BY_OPCODE.get(op)
        _count(self.commands, f"0x{op:04x}" if cmd is None else cmd.name)
        rc, out, r = L.RC_SUCCESS, b"", _NO_RESULT
        try:
            if in_len > L.SLOT_IN:
                raise RingError(L.RC_INVALID_PAYLOAD_LENGTH, f"in_len {in_len} > {L.SLOT_IN}")
            if cmd is None:
                raise RingError(L.RC_UNSUPPORTED, f"unknown opcode 0x{op:04x}")
            o = L.SLOT_IN_OFFSETS[k]
            payload = mm[o : o + in_len] if in_len else b""
            # The handler is named by the command's row of the ring table.
            out, r = getattr(self, cmd.handler)(step, layer, count, payload, arg0, arg1)
            if len(out) > L.SLOT_OUT:  # never write past this command's output slot
                raise RuntimeError(f"response of {len(out)} B exceeds the {L.SLOT_OUT} B slot")
        except RingError as exc:
            rc = exc.rc
            self._log(f"cid {cid} op 0x{op:04x}: {L.RC_NAMES[rc]}: {exc}")
        except Exception as exc:  # a firmware bug must not take the device down
            rc = L.RC_INTERNAL
            self._log(f"cid {cid} op 0x{op:04x}: internal error {type(exc).__name__}: {exc}")
        if rc:
            out, r = b"", _NO_RESULT  # an error completion carries no output
            self.errors += 1
            struct.pack_into("<I", mm, L.RING_BASE + L.DEV_HDR + 32, self.errors)
        _count(self.status_counts, L.RC_NAMES[rc])
        if out:
            o = L.SLOT_OUT_OFFSETS[k]
            mm[o : o + len(out)] = out
        c = L.CQ_OFFSETS[k]
        seq = (i + 1) & 0xFFFFFFFF
        # Every field first, the sequence number last: the guest polls it.
        _CQE_BODY_PACK(mm, c, cid, rc, op, seq, len(out), *r)
        _U32_PACK(mm, c + L.CQE_SEQ_OFFSET, seq)

    def _log(self, msg: str) -> None:
        if len(self.error_log) < 100:
            self.error_log.append(msg)

    def _need_open(self) -> None:
        if self.cache is None:
            raise RingError(L.RC_INVALID_INPUT, "no OPEN before this command")

    def _records(self, payload: bytes, count: int, op: int) -> np.ndarray:
        """Command ``op``'s ``count`` input records, in its row's layout and limit."""
        cmd = L.BY_OPCODE[op]
        dtype, limit = cmd.records, cmd.limit
        if count > limit or count * dtype.itemsize != len(payload):
            raise RingError(
                L.RC_INVALID_PAYLOAD_LENGTH,
                f"count {count} × {dtype.itemsize} B != in_len {len(payload)} (max {limit})",
            )
        return np.frombuffer(payload, dtype=dtype, count=count)

    @staticmethod
    def _check_fields(*limits: tuple[str, np.ndarray, int]) -> None:
        """Guest-given ids index the session's per-context and per-entry arrays: the same
        bounds as the device emulator's (Type3Device.describe), checked before any use."""
        for name, v, hi in limits:
            v = np.asarray(v, dtype=np.int64)
            if v.size and (v.min() < 0 or v.max() > hi):
                bad = int(v.min() if v.min() < 0 else v.max())
                raise RingError(L.RC_INVALID_INPUT, f"{name} {bad} is out of range 0 … {hi}")

    def _check_step(self, step: int) -> None:
        """Steps never go back.  Only checked here: a handler makes ``step`` the current
        step once the firmware has accepted the command (a refused command, by the ring or
        by the device, changes nothing, the session's step included)."""
        if self.step is not None and step < self.step:
            raise RingError(L.RC_INVALID_INPUT, f"step {step} after step {self.step}")

    def op_nop(self, step, layer, count, payload, arg0, arg1):
        return b"", (0, 0, 0, 0, int(arg0))

    def op_open(self, step, layer, count, payload, arg0, arg1):
        if len(payload) != L.OPEN_FMT.size:
            raise RingError(L.RC_INVALID_PAYLOAD_LENGTH, f"OPEN takes {L.OPEN_FMT.size} B")
        n, eb, cap, bt, base = L.OPEN_FMT.unpack(payload)
        if n == 0 or cap == 0:
            raise RingError(L.RC_INVALID_INPUT, f"{n} entries, capacity {cap}: each must be >= 1")
        if eb == 0 or eb % 64:
            raise RingError(L.RC_INVALID_INPUT, f"entry_bytes {eb} is not a multiple of 64")
        if L.KV_BASE + n * eb > self.size:
            raise RingError(L.RC_INVALID_INPUT, f"{n} entries of {eb} B do not fit the device")
        if bt == 0:
            raise RingError(L.RC_INVALID_INPUT, "block_tokens 0")
        new_device = None
        if self.memory_device is None and self.use_device:
            # Before the open session ends: a geometry the device refuses changes nothing.
            new_device = self._dev(self._new_device, n, eb, cap, bt)
        self._archive()
        if self.memory_device is not None:
            # The one device: its firmware session for this cache, its pages the entries'.
            self._dev(
                self.memory_device.open_kv, n, eb, cap, bt, L.KV_BASE,
                policy=self.policy_name, config=self.config, mode=self.mode,
            )  # fmt: skip
            self.device = self.memory_device
            self.fw = self.device.fw
        elif new_device is not None:
            self.device = new_device
            self.fw = self.device.fw  # read for the statistics; only the device drives it
        else:
            # The guest's fields are checked above; a refusal from here would be a bug
            # (Internal Error, counted), not the guest's Invalid Input.
            self.fw = FirmwareSession(
                self.policy_name, cap, self.config, mode=self.mode,
                table=EntryTable(block_tokens=bt, capacity=max(n, 16)), audit=True,
            )  # fmt: skip
            self.fw.ensure(n)
        self.n_entries, self.entry_bytes, self.window_base = n, eb, base
        self.accessed = np.zeros(n, dtype=np.int64)
        return b"", (n, cap, 0, 0, self.size)

    def _new_device(self, n: int, eb: int, cap: int, bt: int):
        """The device emulator for one session: one page per entry, ``cap`` pages of
        device DRAM, entries as the guest creates them.  It keeps its own media (not
        QEMU's file): its migrations move its own bytes, never the guest's memory."""
        unit = 256 << 20  # CXL capacity is managed in 256 MiB units
        capacity = max(unit, -(-n * eb // unit) * unit)
        return Type3Device(
            capacity, page_bytes=eb, dram_pages=cap, policy=self.policy_name,
            config=self.config, entries="host", record_victims=True, audit=True,
            block_tokens=bt, mode=self.mode,
        )  # fmt: skip

    def _dev(self, fn, *args, **kw):
        """One call into the device: its refusal (RequestError) is the ring's INVALID_INPUT,
        any other failure (a plain ValueError included) its INTERNAL error; both are logged
        and counted by ``_serve`` and in ``device_errors``."""
        try:
            return fn(*args, **kw)
        except RequestError as exc:
            self.device_errors += 1
            raise RingError(L.RC_INVALID_INPUT, f"device: {exc}") from None
        except Exception:
            self.device_errors += 1
            raise

    def _decisions(self, d, hints: np.ndarray | None = None) -> tuple[bytes, tuple]:
        """Response: admitted ids, victims (with the tier placement chose), prefetch hints."""
        vic = np.zeros(d.victims.size, L.VICTIM_REC)
        if d.victims.size:
            vic["entry"], vic["tier"] = d.victims, d.tiers
            vic["priority_q16"] = fx.to_q16(np.clip(d.priority, 0.0, 1.0))
            if self.record_victims and self.device is None:  # the device logs its own
                self.victims.extend(int(v) for v in d.victims)
            self.victim_tiers.update(int(t) for t in d.tiers)
        hints = np.zeros(0, np.int64) if hints is None else hints
        room = (L.SLOT_OUT - 4 * d.admitted.size - vic.nbytes) // 4
        hints = hints[: max(room, 0)].astype("<u4")
        self.hints_sent += hints.size
        out = d.admitted.astype("<u4").tobytes() + vic.tobytes() + hints.tobytes()
        return out, (d.admitted.size, vic.size, hints.size)

    def op_create(self, step, layer, count, payload, arg0, arg1):
        self._need_open()
        rec = self._records(payload, count, L.OP_CREATE)
        want = np.arange(self.table.n, self.table.n + count)
        if not np.array_equal(rec["entry"].astype(np.int64), want):
            raise RingError(L.RC_INVALID_INPUT, f"CREATE ids must be the next dense ids {want[:1]}")
        if self.table.n + count > self.n_entries:
            raise RingError(L.RC_INVALID_INPUT, f"more than the {self.n_entries} opened entries")
        if self.device is None:  # before any change: a refused command changes nothing
            self._check_fields(
                ("context", rec["ctx"], MAX_CONTEXTS - 1),
                ("layer", rec["layer"], 0x7FFF),
                ("kv_head", rec["head"], 0x7FFF),
                ("block", rec["block"], 0x7FFFFFFF // self.table.block_tokens),
            )
            cols = [rec[f].astype(np.int64) for f in ("ctx", "layer", "head", "block")]
            grown, cells = index_extents(self.extents, self.index_cells, *cols)
            if cells > MAX_INDEX_CELLS:
                raise RingError(
                    L.RC_INVALID_INPUT,
                    f"the prefetch index would span {cells} cells (at most {MAX_INDEX_CELLS})",
                )
        self._check_step(step)
        if self.device is None:
            self.extents.update(grown)
            self.index_cells = cells
        if self.device is not None:
            cols = (rec["ctx"], rec["layer"], rec["head"], rec["block"])
            self._dev(self.device.describe, want, *cols, step=step)
            d = self._dev(self.device.create_decisions, step, want)
        else:
            self.fw.at(step)
            self.fw.describe(rec["ctx"], rec["layer"], rec["head"], rec["block"])
            d = self.fw.write(step, want)
        self.step = step
        out, (na, nv, nh) = self._decisions(d)
        return out, (0, na, nv, nh, 0)

    def op_ctx_len(self, step, layer, count, payload, arg0, arg1):
        self._need_open()
        rec = self._records(payload, count, L.OP_CTX_LEN)
        ctx, tokens = rec["ctx"].astype(np.int64), rec["tokens"].astype(np.int64)
        if self.device is None:  # before any change: a refused command changes nothing
            self._check_fields(("context", ctx, MAX_CONTEXTS - 1), ("tokens", tokens, 1 << 40))
        self._check_step(step)
        if count:
            if self.device is not None:
                self._dev(self.device.set_context_tokens, ctx, tokens, step=step)
            else:
                self.fw.at(step)
                self.fw.lengths(ctx, tokens)
        self.step = step
        return b"", (0, 0, 0, 0, 0)

    def op_attn(self, step, layer, count, payload, arg0, arg1):
        self._need_open()
        rec = self._records(payload, count, L.OP_ATTN)
        ids = rec["entry"].astype(np.int64)
        w = rec["weight"].astype(np.float64)
        if ids.size and int(ids.max()) >= self.table.n:
            raise RingError(L.RC_INVALID_INPUT, f"entry {int(ids.max())} was never created")
        if not mailbox.attention_weights_valid(w):  # the ring's ATTN is an Attention Report
            raise RingError(L.RC_INVALID_INPUT, "attention weights must be finite and in [0, 1]")
        self._check_step(step)
        if self.device is not None:
            hit, d = self._dev(self.device.report_decisions, step, ids, w)
            hints = self._dev(self.device.prefetch_candidates, ids, w, HINTS_MAX)
        else:
            hit, d = self.fw.read(step, ids, w)
            hints = self.fw.prefetch_candidates(ids, w, HINTS_MAX)
        self.step = step
        out, (na, nv, nh) = self._decisions(d, hints)
        return out, (int(hit.sum()), na, nv, nh, 0)

    def op_end_step(self, step, layer, count, payload, arg0, arg1):
        self._need_open()
        if self.step is None or step != self.step:
            raise RingError(
                L.RC_INVALID_INPUT, f"END_STEP {step} but the current step is {self.step}"
            )
        if self.device is not None:
            self._dev(self.device.end_step, step)
        else:
            self.fw.at(step)
            self.fw.end_step()
        return b"", (0, 0, 0, 0, 0)

    def op_stats(self, step, layer, count, payload, arg0, arg1):
        text = json.dumps(self.stats(brief=True), default=_jsonable).encode()[: L.SLOT_OUT]
        return text, (len(text), 0, 0, 0, 0)

    def op_poison(self, step, layer, count, payload, arg0, arg1):
        dpa, length = int(arg0), int(arg1)
        if length == 0 or length % 64 or dpa % 64 or dpa + length > self.size:
            raise RingError(L.RC_INVALID_INPUT, f"poison range 0x{dpa:x}+0x{length:x}")
        self.poison.append((dpa, length))
        hit = 0
        if self.entry_bytes:
            lo = max(dpa - L.KV_BASE, 0) // self.entry_bytes
            hi = (dpa + length - 1 - L.KV_BASE) // self.entry_bytes
            if dpa + length > L.KV_BASE:
                for e in range(lo, min(hi, self.n_entries - 1) + 1):
                    self.poisoned_entries.add(e)
                    hit += 1
        return b"", (hit, 0, 0, 0, 0)

    def op_close(self, step, layer, count, payload, arg0, arg1):
        self._archive()
        return b"", (0, 0, 0, 0, 0)

    def _archive(self) -> None:
        """End the open session (if any): keep its statistics, drop its state."""
        if self.cache is not None:
            self.sessions.append(self._session_stats())
        self._reset_state()

    # --- TCG plugin stream -----------------------------------------------------------------
    def drain_plugin(self) -> None:
        """Consume the plugin's access records: count CXL.mem traffic per entry."""
        if self.acc is None:
            try:
                fd = os.open(self.plugin_path, os.O_RDWR)
            except FileNotFoundError:
                return
            try:
                sz = os.fstat(fd).st_size
                if sz < L.ACC_HDR_FMT.size:
                    return
                self.acc = mmap.mmap(fd, sz, mmap.MAP_SHARED)
            finally:
                os.close(fd)
        magic, cap, head, tail, dropped, _seen, armed = L.ACC_HDR_FMT.unpack_from(self.acc, 0)
        if magic != L.ACC_MAGIC:
            return
        if (
            cap == 0
            or cap & (cap - 1)
            or L.ACC_HDR_FMT.size + cap * L.ACC_REC.itemsize > len(self.acc)
        ):
            return  # not a ring this file can hold: read nothing from it
        if not armed and self.sq_head > 0:
            # The guest is using the device: have the plugin instrument from now on.
            struct.pack_into("<Q", self.acc, L.ACC_ARMED_OFFSET, 1)
        if armed == 2 and self.tracing != L.TRACING_ON:
            self.tracing = L.TRACING_ON
            struct.pack_into("<I", self.mm, L.RING_BASE + L.DEV_TRACING_OFFSET, self.tracing)
        if head <= tail:  # nothing new (or a head behind the tail: nothing to trust)
            return
        n = min(head - tail, cap)
        idx = (np.arange(tail, tail + n) & (cap - 1)).astype(np.int64)
        recs = np.frombuffer(self.acc, dtype=L.ACC_REC, count=cap, offset=L.ACC_HDR_FMT.size)
        r = recs[idx].copy()
        struct.pack_into("<Q", self.acc, 16, tail + n)
        self.plugin_records += n
        self.plugin_dropped = dropped
        # The window base is the guest's (OPEN): any u64, so the arithmetic is u64 (wrapping
        # where it is masked off), never a signed conversion that a large base overflows.
        base = np.uint64(self.window_base if self.window_base else L.WINDOW_BASE)
        gpa = r["gpa"].astype(np.uint64)
        inside = (gpa >= base) & (gpa - base < np.uint64(self.size))
        dpa = np.where(inside, gpa - base, 0).astype(np.int64)
        self.plugin_outside += int(np.count_nonzero(~inside))
        store = (r["size_flags"] & L.ACC_STORE) != 0
        self.plugin_writes += int(np.count_nonzero(store & inside))
        reads = inside & ~store
        self.plugin_reads += int(np.count_nonzero(reads))
        if self.accessed is not None and self.entry_bytes:
            kv = dpa[reads] - L.KV_BASE
            kv = kv[(kv >= 0) & (kv < self.n_entries * self.entry_bytes)] // self.entry_bytes
            np.add.at(self.accessed, kv, 1)  # a read marks its entry accessed

    # --- report ----------------------------------------------------------------------------
    def stats(self, brief: bool = False) -> dict:
        out = {
            "evidence": "Measured",
            "policy": self.policy_name,
            "firmware": (
                "memory-path device"
                if self.memory_device is not None
                else "device emulator"
                if self.use_device
                else "service"
            ),
            "served_on": "doorbell" if self.memory_device is not None else "poll",
            "doorbells": self.doorbells,
            "device_errors": self.device_errors,
            "memory_path_pages_placed": (
                dict(self.memory_device.kv_placed) if self.memory_device is not None else {}
            ),
            "commands": dict(self.commands),
            "completions": dict(self.status_counts),
            "errors": self.errors,
            "error_log": self.error_log[:20],
            "heartbeat": self.heartbeat,
            "window_base": hex(self.window_base) if self.window_base is not None else None,
            "poison_reports": [[hex(a), hex(b)] for a, b in self.poison],
            "poisoned_entries": sorted(self.poisoned_entries),
        }
        if self.plugin_path is not None:
            out["plugin"] = {
                "records": self.plugin_records,
                "reads": self.plugin_reads,
                "writes": self.plugin_writes,
                "outside_window": self.plugin_outside,
                "dropped": int(self.plugin_dropped),
            }
        sessions = [*self.sessions]
        if self.cache is not None:
            sessions.append(self._session_stats())
        if brief:
            drop = ("victims", "device")
            sessions = [{k: v for k, v in d.items() if k not in drop} for d in sessions]
        out["sessions"] = sessions
        return out

    def _session_stats(self) -> dict:
        out = {
            "entries": int(self.table.n),
            "entry_bytes": self.entry_bytes,
            "capacity": self.cache.capacity,
            "cache": self.cache.stats.as_dict(),
            "audit": self.audit.as_dict(),
            "victims_total": int(self.cache.stats.evictions),
            "victims_to_tier": {
                ("cxl" if k == 2 else "nvme"): v for k, v in self.victim_tiers.items()
            },
            "prefetch_hints": self.hints_sent,
            "victims": list(self.victims),
        }
        if self.device is not None:
            # What the device decided, from its own log and statistics.
            out["victims"] = [int(v) for _, v, _ in self.device.victims]
            out["device"] = self.device.stats()
        if self.plugin_path is not None and self.accessed is not None:
            out["plugin_entries_accessed"] = int(np.count_nonzero(self.accessed))
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcxl.qemu.service", description=__doc__)
    ap.add_argument("--media", required=True, help="the device media file QEMU maps")
    ap.add_argument("--out", required=True, help="write statistics JSON here on exit")
    ap.add_argument("--policy", default="ema")
    ap.add_argument("--config", help="policy configuration TOML")
    ap.add_argument("--plugin-ring", help="shared-memory file the TCG plugin writes")
    ap.add_argument("--ready", help="create this file once the ring is initialised")
    ap.add_argument(
        "--device",
        action="store_true",
        help="the firmware is the device emulator (kvcxl.emu.device), in this process: "
        "one Type3Device per OPEN … CLOSE answers the ring (default: the service's own "
        "firmware session, ring-only mode)",
    )
    ap.add_argument(
        "--mode",
        choices=("float", "int"),
        default="float",
        help="EMA arithmetic: float, or int (the Q0.16 contract the RTL computes)",
    )
    args = ap.parse_args(argv)

    cfg = PolicyConfig.load(args.config) if args.config else PolicyConfig()
    svc = FirmwareService(
        args.media,
        policy=args.policy,
        config=cfg,
        plugin_ring=args.plugin_ring,
        device=args.device,
        mode=args.mode,
    )
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    if args.ready:
        Path(args.ready).write_text(str(os.getpid()))
    try:
        svc.run(lambda: bool(stopping))
    finally:
        svc.stop()
        if svc.plugin_path is not None:
            svc.drain_plugin()
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(svc.stats(), f, default=_jsonable)
        os.replace(tmp, args.out)
    return 0


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _jsonable(x: object) -> object:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return None if math.isnan(x) else float(x)
    return str(x)


if __name__ == "__main__":
    sys.exit(main())
