"""CXL.mem message table: widths, packing order, byte encoding round trip, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcxl.cxl import mem


def test_header_widths_are_whole_bytes_and_match_the_spec_subset():
    widths = {c.name: mem.field_widths(c) for c in mem.MESSAGE_CLASSES}
    assert widths["M2S_REQ"]["opcode"] == 4 and widths["S2M_NDR"]["opcode"] == 3
    assert widths["M2S_REQ"]["tag"] == 16 and widths["M2S_REQ"]["addr"] == 46
    assert widths["M2S_RWD"]["byte_enable"] == 64 and widths["M2S_RWD"]["data"] == 512
    for c in mem.MESSAGE_CLASSES:
        assert c.bits % 8 == 0
        if c.has_data:
            lsb, width = c.offsets()["data"]
            assert lsb % 8 == 0 and width == 512 and lsb + width == c.bits
    assert [c.wire_bytes for c in mem.MESSAGE_CLASSES] == [11, 83, 5, 69]


def test_opcode_encodings_are_the_specs():
    assert mem.M2SReqOpcode.MEM_INV == 0 and mem.M2SReqOpcode.MEM_RD == 1
    assert mem.M2SReqOpcode.MEM_RD_DATA == 2 and mem.M2SReqOpcode.MEM_SPEC_RD == 8
    assert mem.M2SRwDOpcode.MEM_WR == 1 and mem.M2SRwDOpcode.MEM_WR_PTL == 2
    assert mem.S2MNDROpcode.CMP == 0 and mem.S2MDRSOpcode.MEM_DATA_NXM == 1


def test_known_vector_fields_land_at_their_offsets():
    msg = mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag=0xBEEF, addr=0x123456789)
    word = mem.pack(msg)
    off = mem.M2S_REQ.offsets()
    assert word & 0xF == 1
    assert (word >> off["tag"][0]) & 0xFFFF == 0xBEEF
    assert (word >> off["addr"][0]) & ((1 << 46) - 1) == 0x123456789
    assert (word >> off["meta_field"][0]) & 3 == mem.MetaField.NO_OP
    wire = mem.encode(msg)
    assert wire[0] == mem.M2S_REQ.code and int.from_bytes(wire[1:], "little") == word


def test_data_byte_zero_is_the_lowest_data_byte_on_the_wire():
    data = bytes(range(64))
    wire = mem.encode(mem.S2MDRS(mem.S2MDRSOpcode.MEM_DATA, tag=1, data=data))
    assert wire[1 + 4 :] == data


def _lines():
    return st.binary(min_size=64, max_size=64)


_msgs = st.one_of(
    st.builds(
        mem.M2SReq,
        opcode=st.sampled_from(list(mem.M2SReqOpcode)),
        tag=st.integers(0, 0xFFFF),
        addr=st.integers(0, (1 << 46) - 1),
        snp_type=st.sampled_from(list(mem.SnpType)),
        meta_field=st.sampled_from(list(mem.MetaField)),
        meta_value=st.sampled_from(list(mem.MetaValue)),
        ld_id=st.integers(0, 15),
    ),
    st.builds(
        mem.M2SRwD,
        opcode=st.just(mem.M2SRwDOpcode.MEM_WR_PTL),
        tag=st.integers(0, 0xFFFF),
        addr=st.integers(0, (1 << 46) - 1),
        data=_lines(),
        byte_enable=st.integers(0, mem.ALL_BYTES),
        poison=st.integers(0, 1),
    ),
    st.builds(
        mem.S2MNDR,
        opcode=st.sampled_from(list(mem.S2MNDROpcode)),
        tag=st.integers(0, 0xFFFF),
        dev_load=st.sampled_from(list(mem.DevLoad)),
    ),
    st.builds(
        mem.S2MDRS,
        opcode=st.sampled_from(list(mem.S2MDRSOpcode)),
        tag=st.integers(0, 0xFFFF),
        data=_lines(),
        poison=st.integers(0, 1),
    ),
)


@given(_msgs)
def test_encode_decode_round_trip(msg):
    wire = mem.encode(msg)
    assert len(wire) == msg.CLASS.wire_bytes
    assert int.from_bytes(wire[1:], "little") == mem.pack(msg)  # the field table's packing
    assert mem.unpack(msg.CLASS, mem.pack(msg)) == msg
    assert mem.decode(wire) == msg


@given(st.binary(max_size=100))
def test_decode_of_any_bytes_is_a_message_or_a_named_refusal(buf):
    try:
        msg = mem.decode(buf)
    except mem.MessageError as exc:
        assert exc.reason in mem.ERROR_REASONS
    else:
        assert mem.encode(msg)[0] == buf[0] and len(buf) == msg.CLASS.wire_bytes


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (mem.M2SReq(opcode=3, tag=0, addr=0), "bad_opcode"),  # MemRdFwd: not Type-3
        (mem.M2SReq(opcode=1, tag=1 << 16, addr=0), "bad_field"),
        (mem.M2SReq(opcode=1, tag=0, addr=1 << 46), "bad_field"),
        (mem.M2SRwD(opcode=1, tag=0, addr=0, data=bytes(64), byte_enable=1), "bad_byte_enable"),
        (mem.M2SRwD(opcode=2, tag=0, addr=0, data=bytes(63)), "bad_field"),
        (mem.S2MDRS(opcode=7, tag=0, data=bytes(64)), "bad_opcode"),
    ],
)
def test_invalid_messages_are_refused_with_a_reason(msg, reason):
    with pytest.raises(mem.MessageError) as exc:
        mem.encode(msg)
    assert exc.value.reason == reason


def test_decode_refusals():
    with pytest.raises(mem.MessageError, match="empty"):
        mem.decode(b"")
    with pytest.raises(mem.MessageError, match="unknown_class"):
        mem.decode(b"\x09" + bytes(10))
    with pytest.raises(mem.MessageError, match="bad_length"):
        mem.decode(b"\x01" + bytes(9))


def test_reserved_bits_are_ignored_on_receive():
    wire = bytearray(mem.encode(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag=7, addr=9)))
    wire[-1] |= 0xE0  # rsvd bits 79:77
    assert mem.decode(bytes(wire)) == mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag=7, addr=9)


def test_table_imports_without_numpy_or_amaranth():
    import subprocess
    import sys

    code = (
        "import sys; import kvcxl.cxl.mem; "
        "assert 'numpy' not in sys.modules and 'amaranth' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.hdl
def test_amaranth_struct_layouts_built_from_the_table_match_its_packing():
    pytest.importorskip("amaranth")
    from amaranth.hdl import unsigned
    from amaranth.lib import data

    for cls in mem.MESSAGE_CLASSES:
        layout = data.StructLayout({n: unsigned(w) for n, w in mem.field_widths(cls).items()})
        assert layout.size == cls.bits
        assert {n: (f.offset, f.width) for n, f in layout} == cls.offsets()
    msg = mem.M2SRwD(2, 0xBEEF, 123, bytes(range(64)), byte_enable=0xF0F0, poison=1)
    layout = data.StructLayout({n: unsigned(w) for n, w in mem.field_widths(mem.M2S_RWD).items()})
    view = data.Const(layout, mem.pack(msg))
    assert (view.tag, view.addr, view.byte_enable, view.poison) == (0xBEEF, 123, 0xF0F0, 1)
    assert view.data == int.from_bytes(bytes(range(64)), "little")
