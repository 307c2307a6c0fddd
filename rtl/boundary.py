"""The CXL IP boundary: which Verilog ports of the front end a CXL controller IP drives
and reads, mapped to the CXL.mem message table (:mod:`kvcxl.cxl.mem`).

:func:`markdown_table` generates the table in docs/rtl.md ("The CXL IP boundary") from
the front end's own signature and payload layouts, so the document cannot drift from
the RTL (tests/test_rtl_frontend.py compares them).
"""

from __future__ import annotations

from amaranth.hdl import Shape
from amaranth.lib import data, wiring

from kvcxl.cxl import mem as cxl

from .frontend import CxlMemFrontEnd

STREAMS = {
    # front-end stream: (message class, what the controller IP does with it)
    "req": (cxl.M2S_REQ, "IP → engine: a host request without data"),
    "rwd": (cxl.M2S_RWD, "IP → engine: a host write with its line"),
    "ndr": (cxl.S2M_NDR, "engine → IP: a completion without data"),
    "drs": (cxl.S2M_DRS, "engine → IP: read data"),
}
OTHER_PORTS = {
    "touch": "engine-internal: the entry a decoded read belongs to (to the weight buffer)",
    "hdm_commit": "HDM Decoder 0 Control: Commit (the decoder decodes only when set)",
    "hdm_base": "HDM Decoder 0 Base High:Low, HPA[51:28] (256 MiB units)",
    "hdm_size": "HDM Decoder 0 Size High:Low, [51:28] (256 MiB units)",
    "hdm_ig": "HDM Decoder 0 Control: IG (granularity 256 B << IG)",
    "hdm_iw": "HDM Decoder 0 Control: IW (1 << IW ways)",
    "hdm_pos": "this device's position in the interleave set (the emulator's model)",
}


def _rows(name: str, payload: data.StructLayout) -> list[str]:
    cls, role = STREAMS[name]
    docs = {f.name: f.doc for f in cls.fields}
    rows = [
        f"| `{name}__valid` | 1 | {cls.name} | valid | {role} |",
        f"| `{name}__ready` | 1 | {cls.name} | ready | back-pressure: the beat moves when "
        "valid and ready are both high |",
    ]
    for field, member in payload:
        width = Shape.cast(member.shape).width
        bits = (
            f"[{member.offset + width - 1}:{member.offset}]" if width > 1 else f"[{member.offset}]"
        )
        rows.append(f"| `{name}__payload{bits}` | {width} | {cls.name} | {field} | {docs[field]} |")
    return rows


def markdown_table() -> str:
    """The boundary table: one row per Verilog port or payload field of the front end."""
    fe = CxlMemFrontEnd()
    fe._MustUse__silence = True  # read for its ports only, never elaborated
    out = [
        "| Verilog port | bits | message | field | meaning |",
        "|---|---|---|---|---|",
    ]
    members = dict(fe.signature.members)
    for name in STREAMS:
        payload = members[name].signature.members["payload"].shape
        out += _rows(name, payload)
    for name, meaning in OTHER_PORTS.items():
        member = members[name]
        direction = "out" if member.flow == wiring.Out else "in"
        if member.is_signature:  # a stream: its payload, with valid and ready beside it
            width = Shape.cast(member.signature.members["payload"].shape).width
            port = f"`{name}__payload` ({direction}; `{name}__valid`, `{name}__ready`)"
        else:
            width = Shape.cast(member.shape).width
            port = f"`{name}` ({direction})"
        out.append(f"| {port} | {width} | — | — | {meaning} |")
    return "\n".join(out)
