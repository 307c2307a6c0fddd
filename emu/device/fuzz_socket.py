"""Fuzzing the device service through its socket, with a model that predicts every answer.

Each case starts from a valid frame (READ, WRITE or a CXL.mem request at addresses around
the decoder's edges) and is **mutated** — bit flips, truncation, extension, a boundary
address or length, another frame kind, a frame length the stream cannot carry — until it
differs from the frame it came from: no unmodified case is counted.  The mutated frame goes
over a real Unix socket to a running service.

A small model of the protocol (docs/device.md, "The service"; the CXL.mem wire format is
:mod:`kvcxl.cxl.mem`, the one table every part shares) predicts the answer: the
response kind or the ERROR reason, and for an answered request its flags and bytes (a
shadow of device memory: what was written where a decoder maps, zeros elsewhere, poisoned
lines).  Counted:

* **crashes** — the connection dropped or timed out where the model expects an answer, or
  an ``internal`` ERROR frame (an exception inside the service);
* **wrong answers** — any other difference from the model's prediction;
* **changed bytes** — bytes of device memory that differ from the shadow when the window
  the cases address is swept (every ``sweep_every`` cases and at the end).

Frame kinds the model does not cover (CCI 02h, HDM 05h, PLACE 06h: a mutated HDM frame
could reprogram the decoders under the model) are never produced; the in-process fuzzer
(:mod:`kvcxl.emu.device.fuzz`) covers them.
"""

from __future__ import annotations

import random
import socket
import struct
from collections import Counter
from pathlib import Path

from kvcxl.cxl import mem

from .service import ERROR, MAX_FRAME, MAX_IO, MEM, READ, WRITE, recv_frame

PAGE = 4096
KIND_NAMES = {MEM: "MEM", READ: "READ", WRITE: "WRITE"}


class Model:
    """The protocol's expected behaviour over one decoder [base, end), ways 1."""

    def __init__(self, base: int, end: int) -> None:
        self.base, self.end = base, end
        self.pages: dict[int, bytearray] = {}
        self.poison: set[int] = set()  # HPA line numbers

    def mapped(self, hpa: int) -> bool:
        return self.base <= hpa < self.end

    def read(self, hpa: int, n: int) -> bytes:
        out = bytearray(n)
        lo, hi = max(hpa, self.base), min(hpa + n, self.end)
        a = lo
        while a < hi:
            p, off = divmod(a, PAGE)
            m = min(hi - a, PAGE - off)
            page = self.pages.get(p)
            if page is not None:
                out[a - hpa : a - hpa + m] = page[off : off + m]
            a += m
        return bytes(out)

    def write(self, hpa: int, data: bytes) -> None:
        lo, hi = max(hpa, self.base), min(hpa + len(data), self.end)
        a = lo
        while a < hi:
            p, off = divmod(a, PAGE)
            m = min(hi - a, PAGE - off)
            page = self.pages.setdefault(p, bytearray(PAGE))
            page[off : off + m] = data[a - hpa : a - hpa + m]
            a += m

    def poisoned(self, hpa: int, n: int) -> bool:
        lo, hi = max(hpa, self.base), min(hpa + n, self.end)
        return lo < hi and any(line in self.poison for line in range(lo >> 6, (hi - 1 >> 6) + 1))

    def set_poison(self, hpa: int, n: int, poison: bool) -> None:
        lo, hi = max(hpa, self.base), min(hpa + n, self.end)
        if lo >= hi:
            return
        if poison:
            self.poison.update(range(lo >> 6, (hi - 1 >> 6) + 1))
        else:  # a write covering a whole line replaces it: its poison is gone
            first = (lo + 63) >> 6
            last = (hi >> 6) - 1
            for line in range(first, last + 1):
                self.poison.discard(line)

    # --- predictions: (response kind, body or reason prefix) -----------------------------
    def expect(self, kind: int, body: bytes) -> tuple[int, bytes]:
        """The answer the protocol requires, applying the request to the model."""
        if kind == READ:
            if len(body) != 12:
                return ERROR, b"bad_length"
            hpa, n = struct.unpack("<QI", body)
            if n > MAX_IO or hpa + n > mem.HPA_LIMIT:
                return ERROR, b"bad_range"
            unmapped = not (self.mapped(hpa) and (n == 0 or self.mapped(hpa + n - 1)))
            flags = (1 if self.poisoned(hpa, n) else 0) | (2 if unmapped and n else 0)
            return READ, bytes([flags]) + self.read(hpa, n)
        if kind == WRITE:
            if len(body) < 16:
                return ERROR, b"bad_length"
            hpa, flags = struct.unpack_from("<QB", body)
            data = body[16:]
            n = len(data)
            if n > MAX_IO or hpa + n > mem.HPA_LIMIT:
                return ERROR, b"bad_range"
            self.write(hpa, data)
            if n:
                self.set_poison(hpa, n, bool(flags & 1))
            unmapped = n and not (self.mapped(hpa) and self.mapped(hpa + n - 1))
            return WRITE, bytes([2 if unmapped else 0])
        if kind == MEM:
            try:
                msg = mem.decode(body)
            except mem.MessageError as exc:
                return ERROR, f"mem_{exc.reason}".encode()
            if isinstance(msg, mem.M2SReq):
                return MEM, self._req(msg)
            if isinstance(msg, mem.M2SRwD):
                return MEM, self._rwd(msg)
            return ERROR, b"mem_wrong_direction"
        return ERROR, b"bad_kind"

    def _req(self, msg: mem.M2SReq) -> bytes:
        op = msg.opcode
        if op == mem.M2SReqOpcode.MEM_INV:
            return mem.encode(mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id))
        if op == mem.M2SReqOpcode.MEM_SPEC_RD:
            return b""
        hpa = msg.addr << 6
        if not self.mapped(hpa):
            nxm = mem.S2MDRSOpcode.MEM_DATA_NXM
            return mem.encode(mem.S2MDRS(nxm, msg.tag, bytes(64), poison=1, ld_id=msg.ld_id))
        return mem.encode(
            mem.S2MDRS(
                mem.S2MDRSOpcode.MEM_DATA,
                msg.tag,
                self.read(hpa, 64),
                poison=int((hpa >> 6) in self.poison),
                ld_id=msg.ld_id,
            )
        )

    def _rwd(self, msg: mem.M2SRwD) -> bytes:
        hpa = msg.addr << 6
        if self.mapped(hpa):
            if msg.byte_enable == mem.ALL_BYTES:
                self.write(hpa, msg.data)
                self.set_poison(hpa, 64, bool(msg.poison))
            else:
                line = bytearray(self.read(hpa, 64))
                for i in range(64):
                    if msg.byte_enable >> i & 1:
                        line[i] = msg.data[i]
                self.write(hpa, bytes(line))
                if msg.poison:
                    self.poison.add(hpa >> 6)
        return mem.encode(mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id))


class SocketFuzzer:
    def __init__(self, path: str | Path, base: int, end: int, seed: int = 0) -> None:
        self.path = str(path)
        self.base, self.end = base, end
        self.model = Model(base, end)
        self.rng = random.Random(seed)
        self.sock: socket.socket | None = None
        self.cases = 0
        self.crashes = 0
        self.wrong = 0
        self.changed_bytes = 0
        self.coverage: Counter[str] = Counter()
        self.mutations: Counter[str] = Counter()
        self.examples: list[str] = []
        self.touched: set[int] = set()  # pages the cases addressed (swept)

    # --- plumbing ------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(self.path)
        return self.sock

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _note(self, what: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(what)

    # --- the valid frames cases start from --------------------------------------------------
    def _address(self) -> int:
        r = self.rng
        edge = r.choice([self.base, self.end])
        return max(0, edge + r.randrange(-8192, 8192))

    def _valid(self) -> tuple[int, bytes]:
        r = self.rng
        kind = r.choice([READ, WRITE, MEM])
        hpa = self._address()
        if kind == READ:
            return READ, struct.pack("<QI", hpa, r.randrange(1, 4097))
        if kind == WRITE:
            data = r.randbytes(r.randrange(1, 4097))
            return WRITE, struct.pack("<QB7x", hpa, int(r.random() < 0.1)) + data
        line = hpa >> 6
        tag = r.randrange(1 << 16)
        if r.random() < 0.5:
            op = r.choice(list(mem.M2SReqOpcode))
            return MEM, mem.encode(mem.M2SReq(op, tag, line))
        if r.random() < 0.5:
            msg = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, tag, line, r.randbytes(64))
        else:
            be = r.getrandbits(64) or 1
            msg = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR_PTL, tag, line, r.randbytes(64), be)
        return MEM, mem.encode(msg)

    def _mutate(self, kind: int, body: bytes) -> tuple[int, bytes, str]:
        r = self.rng
        how = r.choice(["flip", "truncate", "extend", "boundary", "kind", "frame_length"])
        if how == "flip":
            b = bytearray(body)
            for _ in range(r.randrange(1, 4)):
                i = r.randrange(len(b))
                b[i] ^= 1 << r.randrange(8)
            return kind, bytes(b), how
        if how == "truncate":
            return kind, body[: r.randrange(len(body))], how
        if how == "extend":
            return kind, body + r.randbytes(r.randrange(1, 64)), how
        if how == "boundary":
            lim = mem.HPA_LIMIT
            edges = [self.base - 64, self.base, self.end - 64, self.end - 1, self.end,
                     lim - 64, lim - 1, lim, (1 << 64) - 1]  # fmt: skip
            hpa = r.choice(edges)
            if kind == READ:
                n = r.choice([0, 1, 64, MAX_IO, MAX_IO + 1])
                return kind, struct.pack("<QI", hpa, n), how
            if kind == WRITE:
                return kind, struct.pack("<Q", hpa) + body[8:], how
            msg = mem.decode(body)
            fields = {k: getattr(msg, k) for k in msg.__dataclass_fields__ if k != "CLASS"}
            fields["addr"] = (hpa >> 6) & ((1 << 46) - 1)
            return kind, mem.encode(type(msg)(**fields)), how
        if how == "kind":  # never CCI, HDM or PLACE (02h, 05h, 06h): no rules for them here
            return (
                r.choice([k for k in (MEM, READ, WRITE, 0, 8, 0x7F, 0xFF) if k != kind]),
                body,
                how,
            )
        return kind, body, how  # frame_length: sent with a length the stream cannot carry

    # --- one case -----------------------------------------------------------------------------
    def case(self) -> None:
        kind, body = self._valid()
        mkind, mbody, how = self._mutate(kind, body)
        while how != "frame_length" and (mkind, mbody) == (kind, body):
            mkind, mbody, how = self._mutate(kind, body)  # every counted case is mutated
        self.cases += 1
        self.mutations[how] += 1
        name = KIND_NAMES.get(mkind, f"{mkind:#04x}")
        if mkind in (READ, WRITE) and len(mbody) >= 8:
            self.touched.add(struct.unpack_from("<Q", mbody)[0] // PAGE)
        try:
            s = self._connect()
            if how == "frame_length":
                s.sendall(struct.pack("<I", self.rng.choice([0, MAX_FRAME + 1])))
                got = recv_frame(s)
                ok = got is not None and got[0] == ERROR and got[1].startswith(b"bad_frame")
                closed = s.recv(1) == b""
                self._drop()
                self._count(
                    f"frame_length -> {'ERROR bad_frame' if got else 'none'}", ok and closed
                )
                return
            want_kind, want = self.model.expect(mkind, mbody)
            s.sendall(struct.pack("<IB", len(mbody) + 1, mkind) + mbody)
            got = recv_frame(s)
        except OSError as exc:
            self.crashes += 1
            self._note(f"crash: {name} ({how}): {type(exc).__name__}: {exc}")
            self._drop()
            return
        if got is None:
            self.crashes += 1
            self._note(f"crash: {name} ({how}): connection closed")
            self._drop()
            return
        gk, gb = got
        if gk == ERROR:
            reason = gb.split(b":", 1)[0]
            outcome = f"ERROR {reason.decode(errors='replace')}"
            if reason == b"internal":
                self.crashes += 1
                self._note(f"crash: {name} ({how}): {gb[:120]!r}")
                self.coverage[f"{name} -> {outcome}"] += 1
                return
            ok = want_kind == ERROR and reason == want
        else:
            outcome = KIND_NAMES.get(gk, hex(gk))
            if gk == MEM and gb:
                outcome += " " + type(mem.decode(gb)).__name__
            if gk in (READ, WRITE):  # flags, 7 pad, f64 latency (not modelled), data
                ok = gk == want_kind and gb[:1] == want[:1] and gb[16:] == want[1:]
            else:
                ok = gk == want_kind and gb == want
        self.coverage[f"{name} -> {outcome}"] += 1
        if not ok:
            self.wrong += 1
            wk = KIND_NAMES.get(want_kind, "ERROR")
            self._note(
                f"wrong: {name} ({how}) {mbody[:24].hex()}: got {outcome} {gb[:24].hex()}, "
                f"want {wk} {want[:24]!r}"
            )

    def _count(self, key: str, ok: bool) -> None:
        self.coverage[key] += 1
        if not ok:
            self.wrong += 1
            self._note(f"wrong: {key}")

    def sweep(self) -> None:
        """Read back every page the cases addressed (and its neighbours): any byte that
        differs from the shadow was changed outside what a request addressed."""
        near = self.touched | set(self.model.pages)
        pages = sorted({p + d for p in near for d in (-1, 0, 1) if p + d >= 0})
        s = self._connect()
        for p in pages:
            hpa = p * PAGE
            if hpa + PAGE > mem.HPA_LIMIT:
                continue
            s.sendall(struct.pack("<IBQI", 13, READ, hpa, PAGE))
            got = recv_frame(s)
            if got is None or got[0] != READ:
                self.crashes += 1
                self._note(f"crash: sweep read at {hpa:#x}: {got!r:.80}")
                self._drop()
                return
            want = self.model.read(hpa, PAGE)
            diff = sum(a != b for a, b in zip(got[1][16:], want, strict=True))
            if diff:
                self.changed_bytes += diff
                self._note(f"changed: {diff} bytes of page {hpa:#x}")


def run(
    path: str | Path, base: int, end: int, cases: int, *, seed: int = 0, sweep_every: int = 500
) -> dict:
    """Fuzz the service at ``path`` (decoder 0 maps [base, end), ways 1, nothing written yet)."""
    f = SocketFuzzer(path, base, end, seed)
    for i in range(cases):
        f.case()
        if (i + 1) % sweep_every == 0:
            f.sweep()
    f.sweep()
    f._drop()
    return {
        "interface": "the device service's Unix socket (kvcxl device serve)",
        "cases": f.cases,
        "unmodified_cases": 0,
        "crashes": f.crashes,
        "wrong_answers": f.wrong,
        "changed_bytes": f.changed_bytes,
        "mutations": dict(f.mutations),
        "coverage": dict(sorted(f.coverage.items())),
        "examples": f.examples,
        "evidence": "Measured",
    }
