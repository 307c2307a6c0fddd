"""The fuzzer: random and malformed frames against the service engine; nothing may crash.

Every case is one frame handed to :class:`kvcxl.emu.device.service.Engine` — the
same code path the socket service runs — and its answer is classified:

* CXL.mem requests answered by an S2M message (``mem:MEM_DATA``, ``mem:CMP``,
  ``mem:MEM_DATA_NXM``, ...) or, for MemSpecRd, by no message (``mem:none``);
* malformed CXL.mem bytes answered by an ERROR frame naming the reason
  (``error:mem_bad_opcode``, ...);
* mailbox requests answered by a CCI response carrying a spec return code
  (``cci:SUCCESS``, ``cci:INVALID_PAYLOAD_LENGTH``, ...);
* READ/WRITE/HDM frames answered by their response or an ERROR frame.

A **crash** is an exception escaping the engine, an ``error:internal`` frame, a
mailbox INTERNAL_ERROR (a handler bug caught by the safety net), a response
that does not parse, or a response whose tag differs from the request's.  The
device's own count of caught exceptions (``internal_errors``) is reported beside
as ``device_internal_errors`` and fails the run too: a handler answers Invalid
Input only for a refusal it names, so no bug hides behind a return code.

Cases come from two generators: a fast seeded random generator (mutated valid
messages, random bytes, boundary values) and — for ``hypothesis_fraction`` of
the cases — Hypothesis strategies over message fields and payloads.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE
from kvcxl.firmware.config import PARAMS

from .device import Type3Device
from .service import CCI, ERROR, HDM, MEM, READ, READ_REQ, WRITE, WRITE_REQ, Engine

BASE = 1 << 36


def _records(dtype: np.dtype, rows: list[tuple]) -> bytes:
    """Records in the command table's layout (kvcxl.cxl.mailbox)."""
    return np.array(rows, dtype=dtype).tobytes()


def _fixed(op: mb.Opcode, *values: object) -> bytes:
    """The fixed part of ``op``'s request, in its row's layout of the command table."""
    return mb.COMMANDS[op].request.fixed.pack(*values)


def make_engine(seed: int = 0) -> Engine:
    dev = Type3Device(2 * GRANULE, dram_pages=64, record_victims=False)
    dev.hdm.program(0, base=BASE, size=2 * GRANULE, ways=2, granularity=1024, position=seed % 2)
    dev.hdm.commit(0)
    return Engine(dev)


class Fuzzer:
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.engine = make_engine(seed)
        self.outcomes: Counter[str] = Counter()
        self.crashes: list[dict] = []
        self.cases = 0
        self.unmodified = 0  # valid cases sent as they are: baseline traffic, not fuzz

    # --- one case --------------------------------------------------------------------
    def run_case(
        self, kind: int, body: bytes, tag: int | None = None, mutated: bool = True
    ) -> None:
        self.cases += 1
        self.unmodified += not mutated
        try:
            rkind, rbody = self.engine.handle(kind, body)
            outcome = self._classify(kind, rkind, rbody, tag)
        except Exception as exc:  # the one thing that must never happen
            outcome = f"crash:{type(exc).__name__}"
        self.outcomes[outcome] += 1
        if outcome.startswith("crash") and len(self.crashes) < 20:
            self.crashes.append({"kind": kind, "body": body[:64].hex(), "outcome": outcome})

    def _classify(self, kind: int, rkind: int, rbody: bytes, tag: int | None) -> str:
        if rkind == ERROR:
            reason = rbody.decode("utf-8", "replace").split(":", 1)[0]
            return "crash:internal" if reason == "internal" else f"error:{reason}"
        if rkind != kind:
            return "crash:wrong_kind"
        if kind == MEM:
            if not rbody:
                return "mem:none"
            rsp = mem.decode(rbody)
            if tag is not None and rsp.tag != tag:
                return "crash:tag_mismatch"
            return f"mem:{rsp.CLASS.opcodes(rsp.opcode).name}"
        if kind == CCI:
            rsp = mb.CciMessage.decode(rbody)
            if rsp.category != mb.CAT_RESPONSE or (tag is not None and rsp.tag != tag):
                return "crash:bad_cci_response"
            rc = mb.ReturnCode(rsp.rc)
            return (
                "crash:internal_error" if rc is mb.ReturnCode.INTERNAL_ERROR else f"cci:{rc.name}"
            )
        if kind in (READ, WRITE):
            return f"{'read' if kind == READ else 'write'}:ok"
        if kind == HDM:
            r = json.loads(rbody)
            return "hdm:ok" if r["ok"] else f"hdm:{r['reason']}"
        return "crash:unexpected_kind"

    # --- random generator ----------------------------------------------------------------
    def random_case(self) -> None:
        r = self.rng
        choice = r.random()
        if choice < 0.30:
            self._mem_case()
        elif choice < 0.65:
            self._cci_case()
        elif choice < 0.75:
            self._vendor_case()
        elif choice < 0.85:
            self._rw_case()
        elif choice < 0.92:
            self._hdm_case()
        else:
            kind = r.choice([0, 6, 0x7F, 0xFF, r.randrange(256)])
            self.run_case(kind, r.randbytes(r.randrange(32)))

    def _addr(self) -> int:
        r = self.rng
        return r.choice(
            [
                (BASE >> 6) + r.randrange(2 * GRANULE >> 6),  # inside the decoder
                r.randrange(1 << 46),  # anywhere
                (1 << 46) - 1,
                0,
                ((BASE + 2 * GRANULE) >> 6) + r.randrange(4),  # just past the end
            ]
        )

    def _valid_mem(self) -> tuple[mem.Message, int]:
        r = self.rng
        tag = r.randrange(1 << 16)
        if r.random() < 0.5:
            msg = mem.M2SReq(r.choice(list(mem.M2SReqOpcode)), tag, self._addr())
        else:
            op = r.choice(list(mem.M2SRwDOpcode))
            be = mem.ALL_BYTES if op == mem.M2SRwDOpcode.MEM_WR else r.getrandbits(64)
            msg = mem.M2SRwD(op, tag, self._addr(), r.randbytes(64), be, r.randrange(2))
        return msg, tag

    def _mem_case(self) -> None:
        r = self.rng
        msg, tag = self._valid_mem()
        wire = bytearray(mem.encode(msg))
        mode = r.random()
        if mode < 0.5:
            self.run_case(MEM, bytes(wire), tag, mutated=False)
            return
        if mode < 0.7:  # flip bits
            for _ in range(r.randint(1, 4)):
                i = r.randrange(len(wire))
                wire[i] ^= 1 << r.randrange(8)
            tag = None
        elif mode < 0.8:
            wire = wire[: r.randrange(len(wire))]
        elif mode < 0.9:
            wire += r.randbytes(r.randint(1, 8))
        else:  # a device-to-host message sent the wrong way
            wire = bytearray(mem.encode(mem.S2MNDR(r.choice(list(mem.S2MNDROpcode)), 1)))
        self.run_case(MEM, bytes(wire), None)

    def _cci_case(self) -> None:
        r = self.rng
        tag = r.randrange(256)
        opcode = r.choice([*mb.COMMANDS, r.randrange(1 << 16), 0x4303, 0xC0FF])
        cmd = mb.COMMANDS.get(opcode)
        valid = cmd is not None and cmd.in_len is not None and r.random() < 0.6
        if valid:
            payload = self._payload_for(opcode, cmd.in_len)
        else:
            payload = r.randbytes(r.choice([0, 1, 7, 8, 16, 24, 72, r.randrange(200)]))
        raw = bytearray(mb.request(opcode, payload, tag))
        mode = r.random()
        if mode < 0.1:
            raw[5:8] = r.randrange(1 << 24).to_bytes(3, "little")  # lying length field
        elif mode < 0.15:
            raw[0] = r.choice([1, 2, 255])  # not a request
        elif mode < 0.2:
            raw = raw[: r.randrange(mb.HEADER_BYTES)]
        mutated = not valid or mode < 0.2
        self.run_case(CCI, bytes(raw), tag if len(raw) > 1 else None, mutated=mutated)

    def _payload_for(self, opcode: int, n: int) -> bytes:
        r = self.rng
        dpa = r.choice([0, 64 * r.randrange(1 << 16), r.randrange(1 << 64), GRANULE * 2, 63])
        if opcode in (mb.Opcode.INJECT_POISON,):
            return _fixed(opcode, dpa)
        if opcode == mb.Opcode.CLEAR_POISON:
            return _fixed(opcode, dpa, r.randbytes(64))
        if opcode == mb.Opcode.GET_POISON_LIST:
            return _fixed(opcode, dpa, r.choice([0, 1, 64, 1 << 20, r.randrange(1 << 64)]))
        if opcode == mb.Opcode.GET_LOG:
            uuid = mb.CEL_UUID if r.random() < 0.7 else r.randbytes(16)
            return _fixed(opcode, uuid, r.randrange(80), r.randrange(1 << 32))
        if opcode == mb.Opcode.VENDOR_GET_VICTIMS:
            return _fixed(opcode, r.randrange(1 << 32), r.randrange(1 << 32))
        return r.randbytes(n)

    def _vendor_case(self) -> None:
        r = self.rng
        tag = r.randrange(256)
        k = r.random()
        if k < 0.4:
            n = r.choice([0, 1, 5, 40, r.randrange(300)])
            recs = _records(
                mb.ATTENTION_RECORD,
                [
                    (
                        r.choice([r.randrange(2 * GRANULE // 4096), r.randrange(1 << 32)]),
                        r.choice([r.random(), 0.0, 1.0, -1.0, 2.0, float("nan"), float("inf")]),
                    )
                    for _ in range(n)
                ],
            )
            count = n if r.random() < 0.8 else r.randrange(1 << 32)
            op = mb.Opcode.VENDOR_ATTENTION_REPORT
            payload = _fixed(op, r.randrange(1 << 32), count) + recs
        elif k < 0.8:
            name = r.choice([*PARAMS, "nope", ""])
            value = r.choice([0, 1, -1, 0.5, 1e9, "x", None, [0.1, 0.9], True, {"a": 1}])
            body = {name: value} if r.random() < 0.8 else r.choice([[], 3, "s", {}])
            raw = json.dumps(body).encode()
            payload = raw if r.random() < 0.9 else raw[: r.randrange(len(raw) + 1)] + b"\xff"
            op = mb.Opcode.VENDOR_SET_PARAM
        elif k < 0.9:
            n = r.choice([0, 1, 3, 50, r.randrange(200)])
            big = r.random() < 0.3
            if r.random() < 0.34:
                recs = _records(
                    mb.DESCRIBE_RECORD,
                    [
                        (
                            r.randrange(1 << 32) if big else r.randrange(4096),
                            r.randrange(1 << 32) if big else r.randrange(64),
                            r.randrange(1 << 16),
                            r.randrange(1 << 16),
                            r.randrange(1 << 32) if big else r.randrange(1024),
                        )
                        for _ in range(n)
                    ],
                )
                op = mb.Opcode.VENDOR_DESCRIBE_ENTRIES
                payload = _fixed(op, n) + recs
            elif r.random() < 0.5:
                recs = _records(mb.LENGTH_RECORD, [
                    (r.randrange(1 << 32) if big else r.randrange(64),
                     r.randrange(1 << 64) if big else r.randrange(1 << 16))
                    for _ in range(n)
                ])  # fmt: skip
                op = mb.Opcode.VENDOR_SET_CONTEXT_LENGTHS
                payload = _fixed(op, n) + recs
            else:
                ids = [r.randrange(1 << 32) if big else r.randrange(4096) for _ in range(n)]
                op = mb.Opcode.VENDOR_CREATE_ENTRIES
                recs = _records(mb.ENTRY_RECORD, [(i,) for i in ids])
                payload = _fixed(op, r.randrange(1 << 32), n) + recs
            if r.random() < 0.1:
                payload = payload[: r.randrange(len(payload) + 1)]
        else:
            payload = r.choice([*PARAMS, "nope", ""]).encode() + (
                b"\xff" if r.random() < 0.1 else b""
            )
            op = mb.Opcode.VENDOR_GET_PARAM
        self.run_case(CCI, mb.request(op, payload, tag), tag)

    def _rw_case(self) -> None:
        r = self.rng
        hpa = r.choice([BASE + r.randrange(2 * GRANULE), r.randrange(1 << 52), (1 << 52) - 8])
        if r.random() < 0.5:
            n = r.choice([0, 1, 64, 4096, r.randrange(1 << 16), (1 << 20) + 1])
            body = READ_REQ.pack(hpa, n)
            if r.random() < 0.1:
                body = body[: r.randrange(12)]
            self.run_case(READ, body)
        else:
            body = WRITE_REQ.pack(hpa, r.randrange(4)) + r.randbytes(r.randrange(600))
            if r.random() < 0.1:
                body = body[: r.randrange(16)]
            self.run_case(WRITE, body)

    def _hdm_case(self) -> None:
        r = self.rng
        op = r.choice(["program", "commit", "uncommit", "reset", "list", "bogus", None])
        fields = {
            "index": r.choice([0, 1, 3, 4, -1, "0", None]),
            "base": r.choice([0, GRANULE, BASE, 1, 1 << 60]),
            "size": r.choice([GRANULE, 2 * GRANULE, 0, 3]),
            "ways": r.choice([1, 2, 3, 16]),
            "granularity": r.choice([256, 1024, 300, 32768]),
        }
        req = {"op": op, **{k: v for k, v in fields.items() if r.random() < 0.8}}
        body = json.dumps(req).encode() if r.random() < 0.9 else r.randbytes(10)
        self.run_case(HDM, body)
        if op == "reset" or r.random() < 0.3:  # keep the device mostly mapped
            self.engine.device.hdm.reset()
            d = self.engine.device
            d.hdm.program(0, base=BASE, size=2 * GRANULE, ways=2, granularity=1024)
            d.hdm.commit(0)

    # --- hypothesis generator --------------------------------------------------------------
    def hypothesis_cases(self, n: int) -> None:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st

        msgs = st.one_of(
            st.builds(
                mem.M2SReq,
                opcode=st.sampled_from(list(mem.M2SReqOpcode)),
                tag=st.integers(0, 0xFFFF),
                addr=st.integers(0, (1 << 46) - 1),
                snp_type=st.integers(0, 7),
                meta_field=st.integers(0, 3),
                meta_value=st.integers(0, 3),
                ld_id=st.integers(0, 15),
            ),
            st.builds(
                mem.M2SRwD,
                opcode=st.just(mem.M2SRwDOpcode.MEM_WR_PTL),
                tag=st.integers(0, 0xFFFF),
                addr=st.one_of(
                    st.integers(BASE >> 6, (BASE + 2 * GRANULE >> 6) - 1),
                    st.integers(0, (1 << 46) - 1),
                ),
                data=st.binary(min_size=64, max_size=64),
                byte_enable=st.integers(0, mem.ALL_BYTES),
                poison=st.integers(0, 1),
            ),
        )
        cases = st.one_of(
            msgs.map(lambda m: (MEM, mem.encode(m), m.tag)),
            st.tuples(st.just(MEM), st.binary(max_size=90), st.none()),
            st.builds(
                lambda op, pl, tag: (CCI, mb.request(op, pl, tag), tag),
                st.one_of(st.sampled_from(list(mb.COMMANDS)), st.integers(0, 0xFFFF)),
                st.binary(max_size=96),
                st.integers(0, 255),
            ),
            st.tuples(st.just(CCI), st.binary(max_size=40), st.none()),
            st.tuples(st.integers(0, 255), st.binary(max_size=40), st.none()),
        )

        @settings(
            max_examples=n,
            database=None,
            deadline=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(cases)
        def one(case: tuple[int, bytes, int | None]) -> None:
            self.run_case(*case)

        one()


def run(
    cases: int,
    *,
    seed: int = 0,
    hypothesis_fraction: float = 0.05,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Run ``cases`` fuzz cases; returns the JSON report."""
    if cases < 1:
        raise ValueError(f"cases = {cases} must be >= 1")
    if not 0 <= hypothesis_fraction <= 1:
        raise ValueError(f"hypothesis_fraction = {hypothesis_fraction} must be in [0, 1]")
    f = Fuzzer(seed)
    t0 = time.perf_counter()
    n_hyp = int(cases * hypothesis_fraction)
    if n_hyp:
        f.hypothesis_cases(n_hyp)
        if progress:
            progress(f.cases)
    t_hyp = time.perf_counter() - t0
    hyp_done = f.cases
    reported = f.cases
    while f.cases < cases:
        f.random_case()  # one case each
        if progress and f.cases - reported >= 1024:
            progress(f.cases - reported)
            reported = f.cases
    if progress:
        progress(f.cases - reported)
    wall = time.perf_counter() - t0
    crashes = sum(v for k, v in f.outcomes.items() if k.startswith("crash"))
    return {
        "cases": f.cases,
        "hypothesis_cases": hyp_done,
        "random_cases": f.cases - hyp_done,
        # Valid requests sent unmodified (baseline traffic between the malformed ones):
        # reported apart, so that "cases" is never read as that many mutated inputs.
        "unmodified_cases": f.unmodified,
        "mutated_cases": f.cases - f.unmodified,
        "crashes": crashes,
        # Exceptions the engine's and the mailbox's safety nets caught (each answered as an
        # internal error): a failure like a crash, counted by the device itself.
        "device_internal_errors": f.engine.device.counters["internal_errors"],
        "return_codes": dict(sorted(f.outcomes.items())),
        "crash_examples": f.crashes,
        "seed": seed,
        "wall_s": round(wall, 2),
        "hypothesis_wall_s": round(t_hyp, 2),
        "cases_per_s": round(f.cases / wall, 1),
        "evidence": "Measured",
    }
