"""The RTL's HDM decode (kvcxl.rtl.hdm.HdmDecode) against the emulator's decoder itself.

Every legal (granularity, ways, position) programming, addresses at the decoder's
edges, at granule edges and at random, in Amaranth's simulator; the expected hit and
DPA are ``kvcxl.cxl.hdm.HdmDecoderSet.translate`` of a decoder programmed alike.
(The ``hdm`` formal check proves the same equality for every address against a
reference written from the same parameters; this compares with the code itself.)"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.hdl


def _cases(seed: int) -> list[tuple[dict, list[int]]]:
    from kvcxl.cxl.hdm import GRANULARITIES, GRANULE, WAYS
    from kvcxl.rtl.hdm import HPA_BITS

    rng = random.Random(seed)
    cases = []
    for gran in GRANULARITIES:
        for ways in WAYS:
            for pos in range(ways):
                size = ways * rng.randrange(1, 4) * GRANULE
                base = rng.randrange(0, (1 << HPA_BITS) - size + 1, GRANULE)
                prog = {
                    "base": base,
                    "size": size,
                    "ways": ways,
                    "granularity": gran,
                    "position": pos,
                }
                hpas = [base - 1, base, base + size - 1, base + size]
                for _ in range(6):  # both sides of a granule edge, inside the decoder
                    edge = base + rng.randrange(1, size // gran) * gran
                    hpas += [edge - 1, edge]
                hpas += [base + rng.randrange(size) for _ in range(6)]
                hpas += [rng.randrange(1 << HPA_BITS) for _ in range(2)]
                cases.append((prog, [h for h in hpas if 0 <= h < 1 << HPA_BITS]))
    return cases


def _compare(defect: str | None, seed: int = 1) -> tuple[int, int]:
    """(addresses compared, mismatches) of the RTL decode against HdmDecoderSet."""
    from amaranth.sim import Simulator

    from kvcxl.cxl.hdm import GRANULE_SHIFT, HdmDecoderSet, encode_granularity, encode_ways
    from kvcxl.rtl.hdm import HdmDecode

    dut = HdmDecode(defect=defect)
    cases = _cases(seed)
    counts = [0, 0]

    async def bench(ctx):
        for prog, hpas in cases:
            ref = HdmDecoderSet(prog["size"], count=1)
            ref.program(0, **prog)
            ref.commit(0)
            ctx.set(dut.commit, 1)
            ctx.set(dut.base, prog["base"] >> GRANULE_SHIFT)
            ctx.set(dut.size, prog["size"] >> GRANULE_SHIFT)
            ctx.set(dut.ig, encode_granularity(prog["granularity"]))
            ctx.set(dut.iw, encode_ways(prog["ways"]))
            ctx.set(dut.pos, prog["position"])
            for hpa in hpas:
                ctx.set(dut.hpa, hpa)
                want = ref.translate(hpa)
                hit, dpa = ctx.get(dut.hit), ctx.get(dut.dpa)
                got = dpa if hit else None
                counts[0] += 1
                counts[1] += got != want

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    return counts[0], counts[1]


def test_rtl_decode_equals_the_emulator_decoder():
    n, bad = _compare(None)
    assert n > 5000 and bad == 0, f"{bad} of {n} addresses decoded differently"


def test_a_mis_decoded_interleave_is_caught():
    n, bad = _compare("mis_interleave")
    assert bad > 0, f"the planted interleave defect went unnoticed over {n} addresses"
