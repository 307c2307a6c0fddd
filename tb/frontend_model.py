"""What the CXL.mem front end must answer: random M2S messages and their expected responses.

Expected responses come from the emulator's HDM decoder
(:class:`kvcxl.cxl.hdm.HdmDecoderSet`) and a dictionary line store, not from the
RTL; messages are :mod:`kvcxl.cxl.mem` objects (packed with its ``pack``).
Used by the Amaranth-simulator test and by the cocotb test on Verilator and Icarus.
"""

from __future__ import annotations

import random

from kvcxl.cxl import hdm
from kvcxl.cxl import mem as cxl

BASE = 4 << 30
COUNTS = ("reads", "nxm", "writes", "touches", "stalls", "spec", "inv")
LINES, ENTRY_SHIFT, ENTRIES = 16, 8, 64  # the front end the cocotb test builds
SETUPS = ((1, 256, 0), (2, 1024, 1), (4, 256, 3))  # HDM ways, granularity, position


def params() -> dict:
    """``kvcxl.rtl.export.build("frontend", **params())``: the front end the bench drives."""
    return {"lines": LINES, "entry_shift": ENTRY_SHIFT, "entries": ENTRIES}


class FrontEndModel:
    """One HDM decoder (ways, granularity, position) in front of ``lines`` lines of store."""

    def __init__(
        self,
        seed: int,
        ways: int,
        granularity: int,
        position: int,
        lines: int,
        entry_shift: int,
        store: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.ways, self.granularity, self.position = ways, granularity, position
        self.lines, self.entry_shift = lines, entry_shift
        self.size = hdm.GRANULE * ways
        self.dec = hdm.HdmDecoderSet(dpa_capacity=hdm.GRANULE, count=1)
        self.dec.program(
            0, base=BASE, size=self.size, ways=ways, granularity=granularity, position=position
        )
        self.dec.commit(0)
        # line → (data, poison); a caller reprogramming one device passes the previous store
        self.store: dict[int, tuple[int, int]] = {} if store is None else store
        self.counts = dict.fromkeys(COUNTS, 0)

    def registers(self) -> dict[str, int]:
        """The decoder's register values, by front-end port name."""
        return {
            "hdm_commit": 1,
            "hdm_base": BASE >> 28,
            "hdm_size": self.size >> 28,
            "hdm_ig": hdm.encode_granularity(self.granularity),
            "hdm_iw": hdm.encode_ways(self.ways),
            "hdm_pos": self.position,
        }

    def _hpa(self) -> int:
        rng, ways = self.rng, self.ways
        r = rng.random()
        if r < 0.8:  # near the base, where lines decode into the small store
            off = rng.randrange(0, self.lines * 64 * ways + 2 * self.granularity * ways) & ~63
            return BASE + off
        if r < 0.9:
            return (BASE - 64 * rng.randrange(1, 100)) & ~63
        return BASE + self.size + 64 * rng.randrange(0, 100)

    def messages(self, n: int) -> list:
        rng, out = self.rng, []
        for i in range(n):
            tag = rng.randrange(1 << 16)
            addr = self._hpa() >> 6
            if rng.random() < 0.45:
                full = rng.random() < 0.5
                out.append(
                    cxl.M2SRwD(
                        opcode=cxl.M2SRwDOpcode.MEM_WR if full else cxl.M2SRwDOpcode.MEM_WR_PTL,
                        tag=tag,
                        addr=addr,
                        data=rng.randbytes(64),
                        byte_enable=cxl.ALL_BYTES if full else rng.getrandbits(64),
                        poison=int(rng.random() < 0.1),
                        ld_id=i % 16,
                    )
                )
            else:
                op = rng.choice(list(cxl.M2SReqOpcode))
                out.append(cxl.M2SReq(opcode=op, tag=tag, addr=addr, ld_id=i % 16))
        return out

    def expect(self, msg) -> list[tuple]:
        """The responses the contract asks for: a list of ('touch'|'ndr'|'drs', fields)."""
        counts = self.counts
        dpa = self.dec.translate(msg.addr << 6)
        hit = dpa is not None and (dpa >> 6) < self.lines
        if isinstance(msg, cxl.M2SRwD):
            counts["writes"] += 1
            if hit:
                old, _ = self.store.get(dpa >> 6, (0, 0))
                mask = sum(0xFF << (8 * i) for i in range(64) if msg.byte_enable >> i & 1)
                new = int.from_bytes(msg.data, "little")
                self.store[dpa >> 6] = ((old & ~mask) | (new & mask), msg.poison)
            return [("ndr", (int(cxl.S2MNDROpcode.CMP), msg.tag))]
        op = msg.opcode
        if op == cxl.M2SReqOpcode.MEM_INV:
            counts["inv"] += 1
            return [("ndr", (int(cxl.S2MNDROpcode.CMP), msg.tag))]
        out = [("touch", dpa >> self.entry_shift)] if hit else []
        if op == cxl.M2SReqOpcode.MEM_SPEC_RD:
            counts["spec"] += 1
            return out
        counts["reads"] += 1
        if hit:
            data, poison = self.store.get(dpa >> 6, (0, 0))
            return [*out, ("drs", (int(cxl.S2MDRSOpcode.MEM_DATA), msg.tag, poison, data))]
        counts["nxm"] += 1
        return [("drs", (int(cxl.S2MDRSOpcode.MEM_DATA_NXM), msg.tag, 1, 0))]


def response(name: str, bits: int) -> tuple:
    """An NDR or DRS payload (the port's bits) as the tuple :meth:`FrontEndModel.expect` gives."""
    if name == "ndr":
        p = cxl.unpack(cxl.S2M_NDR, bits)
        return ("ndr", (p.opcode, p.tag)), p.ld_id
    p = cxl.unpack(cxl.S2M_DRS, bits)
    return ("drs", (p.opcode, p.tag, p.poison, int.from_bytes(p.data, "little"))), p.ld_id


def ends_without_response(msg) -> bool:
    """A speculative read has no response (only a touch, when it decodes)."""
    return isinstance(msg, cxl.M2SReq) and msg.opcode == cxl.M2SReqOpcode.MEM_SPEC_RD
