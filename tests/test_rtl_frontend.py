"""CXL.mem front end RTL against the emulator's message table and HDM decoder.

Random M2S Req / RwD messages (packed with kvcxl.firmware.cxl.mem.pack, so the RTL's
layouts are checked against the shared table) through Amaranth's simulator, with
random back-pressure on every response stream; expected responses come from
kvcxl.emu.cxl.hdm.HdmDecoderSet translation and a dictionary line store.
"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.hdl

LINES = 16
ENTRY_SHIFT = 8  # 256 B entries: 4 lines each


def _run(seed: int, ways: int, granularity: int, position: int, n_msgs: int) -> dict:
    from amaranth.sim import Simulator

    from kvcxl.emu.cxl import hdm
    from kvcxl.firmware.cxl import mem as cxl
    from kvcxl.rtl.frontend import CxlMemFrontEnd

    rng = random.Random(seed)
    base = 4 << 30
    size = hdm.GRANULE * ways
    dec = hdm.HdmDecoderSet(dpa_capacity=hdm.GRANULE, count=1)
    dec.program(0, base=base, size=size, ways=ways, granularity=granularity, position=position)
    dec.commit(0)

    dut = CxlMemFrontEnd(lines=LINES, entry_shift=ENTRY_SHIFT, entries=64)
    store: dict[int, tuple[int, int]] = {}
    counts = {"reads": 0, "nxm": 0, "writes": 0, "touches": 0, "stalls": 0, "spec": 0, "inv": 0}

    def rand_hpa() -> int:
        r = rng.random()
        if r < 0.8:  # near the base, where lines decode into the small store
            off = rng.randrange(0, LINES * 64 * ways + 2 * granularity * ways) & ~63
            return base + off
        if r < 0.9:
            return (base - 64 * rng.randrange(1, 100)) & ~63
        return base + size + 64 * rng.randrange(0, 100)

    def expect(msg):
        """The responses the contract asks for: list of ('touch'|'ndr'|'drs', fields)."""
        dpa = dec.translate(msg.addr << 6)
        hit = dpa is not None and (dpa >> 6) < LINES
        if isinstance(msg, cxl.M2SRwD):
            counts["writes"] += 1
            if hit:
                old, _ = store.get(dpa >> 6, (0, 0))
                mask = sum(0xFF << (8 * i) for i in range(64) if msg.byte_enable >> i & 1)
                new = int.from_bytes(msg.data, "little")
                store[dpa >> 6] = ((old & ~mask) | (new & mask), msg.poison)
            return [("ndr", (int(cxl.S2MNDROpcode.CMP), msg.tag))]
        op = msg.opcode
        if op == cxl.M2SReqOpcode.MEM_INV:
            counts["inv"] += 1
            return [("ndr", (int(cxl.S2MNDROpcode.CMP), msg.tag))]
        out = [("touch", dpa >> ENTRY_SHIFT)] if hit else []
        if op == cxl.M2SReqOpcode.MEM_SPEC_RD:
            counts["spec"] += 1
            return out
        counts["reads"] += 1
        if hit:
            data, poison = store.get(dpa >> 6, (0, 0))
            return [*out, ("drs", (int(cxl.S2MDRSOpcode.MEM_DATA), msg.tag, poison, data))]
        counts["nxm"] += 1
        return [("drs", (int(cxl.S2MDRSOpcode.MEM_DATA_NXM), msg.tag, 1, 0))]

    msgs = []
    for i in range(n_msgs):
        tag = rng.randrange(1 << 16)
        addr = rand_hpa() >> 6
        if rng.random() < 0.45:
            full = rng.random() < 0.5
            msgs.append(
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
            msgs.append(cxl.M2SReq(opcode=op, tag=tag, addr=addr, ld_id=i % 16))
    got: list = []
    want: list = []

    async def bench(ctx):
        ctx.set(dut.hdm_commit, 1)
        ctx.set(dut.hdm_base, base >> 28)
        ctx.set(dut.hdm_size, size >> 28)
        ctx.set(dut.hdm_ig, hdm.encode_granularity(granularity))
        ctx.set(dut.hdm_iw, hdm.encode_ways(ways))
        ctx.set(dut.hdm_pos, position)
        for msg in msgs:
            want.extend(expect(msg))
            port = dut.rwd if isinstance(msg, cxl.M2SRwD) else dut.req
            ctx.set(port.payload.as_value(), cxl.pack(msg))
            ctx.set(port.valid, 1)
            done = False
            for _ in range(20):  # until accepted and answered
                for s in (dut.ndr, dut.drs, dut.touch):
                    ctx.set(s.ready, int(rng.random() > 0.3))
                accepted = bool(ctx.get(port.valid) and ctx.get(port.ready))
                for name, s in (("ndr", dut.ndr), ("drs", dut.drs), ("touch", dut.touch)):
                    if ctx.get(s.valid):
                        if not ctx.get(s.ready):
                            counts["stalls"] += 1
                            continue
                        if name == "touch":
                            counts["touches"] += 1
                            got.append(("touch", ctx.get(s.payload)))
                        else:
                            p = cxl.unpack(
                                cxl.S2M_NDR if name == "ndr" else cxl.S2M_DRS,
                                ctx.get(s.payload.as_value()),
                            )
                            if name == "ndr":
                                got.append(("ndr", (p.opcode, p.tag)))
                            else:
                                got.append(
                                    (
                                        "drs",
                                        (
                                            p.opcode,
                                            p.tag,
                                            p.poison,
                                            int.from_bytes(p.data, "little"),
                                        ),
                                    )
                                )
                            assert p.ld_id == msg.ld_id
                            done = True
                await ctx.tick()
                if accepted:
                    ctx.set(port.valid, 0)
                if done:
                    break
            else:
                if not (isinstance(msg, cxl.M2SReq) and msg.opcode == cxl.M2SReqOpcode.MEM_SPEC_RD):
                    raise AssertionError(f"no response to {msg}")
            ctx.set(port.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == want
    return counts


@pytest.mark.parametrize(
    ("ways", "granularity", "position"), [(1, 256, 0), (2, 1024, 1), (4, 256, 3)]
)
def test_front_end_matches_hdm_and_line_store(ways, granularity, position):
    c = _run(
        seed=ways * 7 + position, ways=ways, granularity=granularity, position=position, n_msgs=150
    )
    for key in ("reads", "nxm", "writes", "touches", "stalls", "spec", "inv"):
        assert c[key] > 0, f"{key} never exercised: {c}"


def test_layouts_come_from_the_shared_message_table():
    from kvcxl.firmware.cxl import mem as cxl
    from kvcxl.rtl.frontend import message_layout

    for cls in cxl.MESSAGE_CLASSES:
        lay = message_layout(cls)
        assert lay.size == cls.bits
        for name, (lsb, width) in cls.offsets().items():
            assert lay[name].offset == lsb and lay[name].width == width


def test_ip_boundary_table_in_the_docs_is_the_rtl():
    """docs/rtl.md's CXL IP boundary table is generated from the front end's ports."""
    from pathlib import Path

    from kvcxl.rtl.boundary import markdown_table

    doc = Path(__file__).resolve().parents[1] / "docs" / "rtl.md"
    table = markdown_table()
    assert "`rwd__payload[655:144]` | 512 | M2S_RWD | data" in table
    assert table in doc.read_text()
