"""CXL.mem front end RTL against the emulator's message table and HDM decoder.

Random M2S Req / RwD messages (packed with kvcxl.cxl.mem.pack, so the RTL's
layouts are checked against the shared table) through Amaranth's simulator, with
random back-pressure on every response stream; expected responses come from
kvcxl.cxl.hdm.HdmDecoderSet translation and a dictionary line store
(kvcxl.tb.frontend_model, which the cocotb test on Verilator and Icarus shares).
"""

from __future__ import annotations

import pytest

from kvcxl.cxl import mem as cxl

pytestmark = pytest.mark.hdl

LINES = 16
ENTRY_SHIFT = 8  # 256 B entries: 4 lines each


def _run(seed: int, ways: int, granularity: int, position: int, n_msgs: int) -> dict:
    from amaranth.sim import Simulator

    from kvcxl.rtl.frontend import CxlMemFrontEnd
    from kvcxl.tb.frontend_model import FrontEndModel, ends_without_response, response

    model = FrontEndModel(seed, ways, granularity, position, LINES, ENTRY_SHIFT)
    rng, counts = model.rng, model.counts
    dut = CxlMemFrontEnd(lines=LINES, entry_shift=ENTRY_SHIFT, entries=64)
    msgs = model.messages(n_msgs)
    got: list = []
    want: list = []

    async def bench(ctx):
        for name, value in model.registers().items():
            ctx.set(getattr(dut, name), value)
        for msg in msgs:
            want.extend(model.expect(msg))
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
                            r, ld_id = response(name, ctx.get(s.payload.as_value()))
                            got.append(r)
                            assert ld_id == msg.ld_id
                            done = True
                await ctx.tick()
                if accepted:
                    ctx.set(port.valid, 0)
                if done:
                    break
            else:
                if not ends_without_response(msg):
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
    from kvcxl.cxl import mem as cxl
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
