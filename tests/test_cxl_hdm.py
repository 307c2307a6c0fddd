"""HDM decoders: programming rules, commit/lock, HPA → DPA against a brute-force model."""

from __future__ import annotations

import pytest

from kvcxl.cxl.hdm import GRANULARITIES, GRANULE, WAYS, HdmDecoderSet, HdmError


def _set(ways: int, gran: int, position: int, base: int = 1 << 36) -> HdmDecoderSet:
    s = HdmDecoderSet(GRANULE * 2)
    s.program(0, base=base, size=GRANULE * ways, ways=ways, granularity=gran, position=position)
    s.commit(0)
    return s


@pytest.mark.parametrize("ways", WAYS)
@pytest.mark.parametrize("gran", [256, 4096, 16384])
def test_interleave_set_is_a_bijection_onto_each_devices_dpa(ways, gran):
    devices = [_set(ways, gran, pos) for pos in range(ways)]
    base = 1 << 36
    seen = [dict() for _ in range(ways)]
    # Sample every 64 B line of the first 4 interleave rows plus the window's last line.
    hpas = [*list(range(base, base + 4 * ways * gran, 64)), base + GRANULE * ways - 64]
    for hpa in hpas:
        owners = [
            (i, d.translate(hpa)) for i, d in enumerate(devices) if d.translate(hpa) is not None
        ]
        assert len(owners) == 1, hex(hpa)
        i, dpa = owners[0]
        o = hpa - base
        assert i == (o // gran) % ways
        assert dpa == (o // (gran * ways)) * gran + o % gran  # brute-force expectation
        assert dpa not in seen[i]
        seen[i][dpa] = hpa
        assert 0 <= dpa < GRANULE


def test_chunks_split_at_granules_and_agree_with_translate():
    s = _set(4, 256, 1)
    base = 1 << 36
    pieces = s.chunks(base + 100, 2000)
    assert sum(n for _, _, n in pieces) == 2000
    for hpa, dpa, n in pieces:
        assert dpa == s.translate(hpa)
        assert (hpa - base) // 256 == (hpa + n - 1 - base) // 256


def test_outside_every_decoder_does_not_translate():
    s = _set(1, 256, 0)
    assert s.translate(0) is None
    assert s.translate((1 << 36) + GRANULE) is None
    assert s.chunks(0, 64) == [(0, None, 64)]


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"base": 1, "size": GRANULE}, "misaligned"),
        ({"base": 0, "size": GRANULE, "ways": 3}, "bad_ways"),
        ({"base": 0, "size": GRANULE, "granularity": 512 + 1}, "bad_granularity"),
        ({"base": 0, "size": GRANULE, "ways": 2}, "bad_size"),
        ({"base": 0, "size": 2 * GRANULE, "ways": 2, "position": 2}, "bad_position"),
        ({"base": 0, "size": 0}, "bad_size"),
    ],
)
def test_programming_errors_name_the_rule(kw, reason):
    s = HdmDecoderSet(GRANULE)
    with pytest.raises(HdmError) as exc:
        s.program(0, **kw)
    assert exc.value.reason == reason


def test_commit_order_capacity_and_lock():
    s = HdmDecoderSet(GRANULE * 2, count=3)
    s.program(1, base=GRANULE * 4, size=GRANULE)
    with pytest.raises(HdmError, match="order"):
        s.commit(1)
    s.program(0, base=GRANULE * 8, size=GRANULE, lock=True)
    s.commit(0)
    with pytest.raises(HdmError, match="order"):
        s.commit(1)  # base below decoder 0's end
    s.program(1, base=GRANULE * 9, size=GRANULE)
    s.commit(1)
    assert s.translate(GRANULE * 9) == GRANULE  # DPA continues after decoder 0
    s.program(2, base=GRANULE * 10, size=GRANULE)
    with pytest.raises(HdmError, match="capacity"):
        s.commit(2)
    with pytest.raises(HdmError, match="committed"):
        s.program(0, base=0, size=GRANULE)
    s.uncommit(1)
    with pytest.raises(HdmError, match="locked"):
        s.uncommit(0)
    s.reset()
    assert s.translate(GRANULE * 8) is None


def test_register_encodings():
    from kvcxl.cxl.hdm import encode_granularity, encode_ways

    assert [encode_ways(w) for w in WAYS] == [0, 1, 2, 3, 4]
    assert [encode_granularity(g) for g in GRANULARITIES] == list(range(7))
