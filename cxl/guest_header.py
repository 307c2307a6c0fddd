"""The guest agent's C header ``qemu/guest/kvcxl_ring.h``, generated from the ring's tables.

Every number the guest shares with the firmware service — the DPA map, the ring's
geometry, opcodes and return codes, the struct layouts of the ring, the trace area, the
fuzz area and the TCG plugin's access ring — is written here from the Python tables, so
the two sides cannot drift apart.  The header holds tables only; the C functions the
guest shares with Python (``kvcxl_pattern``) are in the hand-written
``qemu/guest/kvcxl_pattern.h``, which includes this one.

tests/test_qemu_ring.py fails when the committed header is not :func:`render_guest_header`'s
output; rewrite it with::

    python -m kvcxl.cxl.guest_header qemu/guest/kvcxl_ring.h
"""

from __future__ import annotations

import argparse
import re
import struct
import textwrap
from pathlib import Path

import numpy as np

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import ring as L

WRITE_COMMAND = "python -m kvcxl.cxl.guest_header qemu/guest/kvcxl_ring.h"

# struct-format item → (C type, bytes); "x" is padding.
_FMT_TYPES = {
    "B": "uint8_t", "H": "uint16_t", "I": "uint32_t", "Q": "uint64_t",
    "b": "int8_t", "h": "int16_t", "i": "int32_t", "q": "int64_t",
    "f": "float", "d": "double",
}  # fmt: skip
_DTYPE_TYPES = {
    "u1": "uint8_t", "u2": "uint16_t", "u4": "uint32_t", "u8": "uint64_t",
    "i1": "int8_t", "i2": "int16_t", "i4": "int32_t", "i8": "int64_t",
    "f4": "float", "f8": "double",
}  # fmt: skip

# C comments on struct fields (struct name, field): what a C reader needs beside the type.
NOTES = {
    ("kvcxl_dev_hdr", "sq_head"): "commands consumed (free-running)",
    ("kvcxl_dev_hdr", "heartbeat"): "incremented at least every 10 ms while the service runs",
    ("kvcxl_dev_hdr", "errors"): "completions with a non-zero status",
    ("kvcxl_dev_hdr", "tracing"): "TCG plugin: KVCXL_TRACING_NONE, _ARMING, _ON",
    ("kvcxl_host_hdr", "sq_tail"): "doorbell: commands submitted (free-running)",
    ("kvcxl_host_hdr", "cq_head"): "completions consumed (free-running)",
    ("kvcxl_sqe", "count"): "records in the slot's input buffer",
    ("kvcxl_sqe", "in_len"): "bytes used in the slot's input buffer",
    ("kvcxl_cqe", "out_len"): "bytes written in the slot's output buffer",
    ("kvcxl_cqe", "seq"): "written last: completion number + 1 (free-running)",
    ("kvcxl_open", "n_entries"): "KV entries the host will create, at most",
    ("kvcxl_open", "entry_bytes"): "bytes per entry, a multiple of 64",
    ("kvcxl_open", "capacity"): "HBM entries the firmware may keep resident",
    ("kvcxl_open", "block_tokens"): "tokens per KV block",
    ("kvcxl_open", "window_base"): "guest physical address of DPA 0",
    ("kvcxl_create_rec", "entry"): "must be the next dense id",
    ("kvcxl_victim", "tier"): "placement of the evicted entry: 2 CXL DRAM, 3 NVMe",
    ("kvcxl_victim", "priority_q16"): "eviction priority, Q0.16",
    ("kvcxl_trace_hdr", "capacity"): "HBM stand-in capacity in entries",
    ("kvcxl_trace_hdr", "seed"): "of the entries' byte pattern",
    ("kvcxl_trace_batch", "offset"): "of its records, from KVCXL_TRACE_BASE",
    ("kvcxl_fuzz_hdr", "hdr_bytes"): "the cases follow the header",
    ("kvcxl_fuzz_hdr", "results"): "offset of the results, from KVCXL_FUZZ_BASE",
    ("kvcxl_fuzz_case", "in_len"): "as submitted; may be past the slot",
    ("kvcxl_fuzz_case", "offset"): "of the payload, from KVCXL_FUZZ_BASE",
    ("kvcxl_fuzz_case", "length"): "payload bytes written to the input slot",
    ("kvcxl_fuzz_result", "done"): "1 once the case completed",
    ("kvcxl_fuzz_result", "stray"): "bytes changed outside the completion and the output",
    ("kvcxl_acc_hdr", "capacity"): "records, a power of two",
    ("kvcxl_acc_hdr", "head"): "written by the plugin (free-running)",
    ("kvcxl_acc_hdr", "tail"): "written by the service (free-running)",
    ("kvcxl_acc_hdr", "dropped"): "records lost to a full ring",
    ("kvcxl_acc_hdr", "seen"): "CXL-window accesses seen",
    ("kvcxl_acc_hdr", "armed"): "1: the service asks (first ring command); 2: plugin recording",
    ("kvcxl_acc_rec", "size_flags"): "bits 0-15 size in bytes, KVCXL_ACC_STORE a store",
}

# Field = (C type, name, array length or 0, bytes)
Field = tuple[str, str, int, int]


def _struct_fields(fmt: struct.Struct, names: tuple[str, ...]) -> list[Field]:
    """The C fields of a little-endian struct format, named in order; padding is
    ``reserved`` (an array of bytes, or of u32 where it is whole u32s)."""
    items = re.findall(r"(\d*)([xBHIQbhiqfd])", fmt.format.lstrip("<"))
    if "".join(n + c for n, c in items) != fmt.format.lstrip("<"):
        raise ValueError(f"struct format {fmt.format!r}: an item the C header cannot write")
    out: list[Field] = []
    it = iter(names)
    for count, code in items:
        n = int(count or 1)
        if code == "x":
            word = n % 4 == 0
            out.append(("uint32_t" if word else "uint8_t", "reserved", n // 4 if word else n, n))
            continue
        for _ in range(n):
            name = next(it, None)
            if name is None:
                raise ValueError(f"struct format {fmt.format!r}: more items than {names}")
            out.append((_FMT_TYPES[code], name, 0, struct.calcsize("<" + code)))
    if next(it, None) is not None:
        raise ValueError(f"struct format {fmt.format!r}: fewer items than {names}")
    return out


def _dtype_fields(dt: np.dtype) -> list[Field]:
    """The C fields of a record dtype (fields back to back, as the ring's records are)."""
    out: list[Field] = []
    at = 0
    for name in dt.names:
        sub, off = dt.fields[name][:2]
        if off != at:
            raise ValueError(f"dtype {dt}: field {name!r} at {off}, not {at}")
        out.append((_DTYPE_TYPES[sub.str.lstrip("<|")], name, 0, sub.itemsize))
        at += sub.itemsize
    return out


def _needs_packed(fields: list[Field]) -> bool:
    """True when C's natural alignment would move a field or grow the struct."""
    at, widest, size = 0, 1, sum(f[3] for f in fields)
    for ctype, _, n, nbytes in fields:
        align = min(8, nbytes // max(n, 1)) if ctype != "uint8_t" else 1
        widest = max(widest, align)
        if at % align:
            return True
        at += nbytes
    return size % widest != 0


def _struct(name: str, fields: list[Field], doc: str = "") -> list[str]:
    packed = "__attribute__((packed)) " if _needs_packed(fields) else ""
    text = textwrap.wrap(doc, 84)
    out = [("/* " if i == 0 else " * ") + t for i, t in enumerate(text)]
    if out:
        out[-1] += " */"
    out.append(f"struct {packed}{name} {{")
    for ctype, field, n, _ in fields:
        note = NOTES.get((name, field))
        decl = f"    {ctype} {field}{f'[{n}]' if n else ''};"
        out.append(decl + (f" /* {note} */" if note else ""))
    out.append("};")
    return out


def _define(name: str, value: int, suffix: str = "u", note: str = "", hexa: bool = True) -> str:
    text = f"#define KVCXL_{name} {f'0x{value:x}' if hexa else value}{suffix}"
    return text + (f" /* {note} */" if note else "")


def _magic(name: str, value: int) -> str:
    return _define(name, value, note='"' + value.to_bytes(4, "little").decode() + '"')


# What a C reader needs beside a ring command's input record, by the command's name.
RECORD_NOTES = {
    "ATTN": "f32 weights, as the trace holds them (the firmware widens them on reading)",
    "CREATE": "a new entry (written to HBM by the host)",
    "CTX_LEN": "a context's length in tokens",
}


def record_struct(c: L.RingCommand) -> str:
    """The C struct of a ring command's input records: ``kvcxl_<name>_rec``."""
    return f"kvcxl_{c.name.lower()}_rec"


def _record_structs() -> dict[str, tuple[list[Field], str]]:
    """One struct per ring command with input records, from its row."""
    out = {}
    for c in L.RING_COMMANDS:
        if c.records is None:
            continue
        fields = _dtype_fields(c.records)
        doc = f"{c.name} input record"
        same = [m.name for _, m in sorted(mb.COMMANDS.items()) if m.request.records == c.records]
        if same:
            doc += f" = the mailbox's {same[0]} record"
        if _needs_packed(fields):
            doc += f" ({c.records.itemsize} bytes, packed)"
        note = RECORD_NOTES.get(c.name)
        out[record_struct(c)] = (fields, f"{doc}: {note}" if note else doc)
    return out


# The header's structs: C name → (fields, comment), in the order they are declared.
def _structs() -> dict[str, tuple[list[Field], str]]:
    return {
        "kvcxl_dev_hdr": (
            _struct_fields(L.DEV_HDR_FMT, L.DEV_HDR_FIELDS),
            "written by the firmware service only",
        ),
        "kvcxl_host_hdr": (
            _struct_fields(L.HOST_HDR_FMT, L.HOST_HDR_FIELDS),
            "written by the guest only",
        ),
        "kvcxl_sqe": (_struct_fields(L.SQE_FMT, L.SQE_FIELDS), "submission queue entry"),
        "kvcxl_cqe": (_struct_fields(L.CQE_FMT, L.CQE_FIELDS), "completion queue entry"),
        "kvcxl_open": (_struct_fields(L.OPEN_FMT, L.OPEN_FIELDS), "OPEN input"),
        **_record_structs(),
        "kvcxl_victim": (
            _dtype_fields(L.VICTIM_REC),
            "ATTN and CREATE output: r1 admitted ids (u32), r2 victims, r3 prefetch hints (u32).",
        ),
        "kvcxl_trace_hdr": (_struct_fields(L.TRACE_HDR_FMT, L.TRACE_HDR_FIELDS), ""),
        "kvcxl_trace_batch": (_dtype_fields(L.TRACE_BATCH), ""),
        "kvcxl_fuzz_hdr": (_struct_fields(L.FUZZ_HDR_FMT, L.FUZZ_HDR_FIELDS), ""),
        "kvcxl_fuzz_case": (_dtype_fields(L.FUZZ_CASE), ""),
        "kvcxl_fuzz_result": (_dtype_fields(L.FUZZ_RESULT), ""),
        "kvcxl_acc_hdr": (_struct_fields(L.ACC_HDR_FMT, L.ACC_HDR_FIELDS), ""),
        "kvcxl_acc_rec": (_dtype_fields(L.ACC_REC), ""),
    }


def _section(title: str) -> str:
    return f"/* --- {title} " + "-" * max(3, 84 - len(title)) + " */"


def render_guest_header() -> str:
    """``qemu/guest/kvcxl_ring.h``: every number of :mod:`kvcxl.cxl.ring` the guest uses."""
    st = _structs()
    fields_of = {(name, f[1]) for name, (fields, _) in st.items() for f in fields}
    stale = sorted(set(NOTES) - fields_of) + sorted(set(RECORD_NOTES) - set(L.OPCODES.values()))
    if stale:  # a renamed field or command would lose its note without a word
        raise ValueError(f"notes for fields or commands the header does not have: {stale}")

    def decl(name: str) -> list[str]:
        fields, doc = st[name]
        return _struct(name, fields, doc)

    ops = []
    for c in L.RING_COMMANDS:
        note = c.doc if c.mailbox is None else f"= mailbox {c.mailbox.name}: {c.doc}"
        ops.append(_define(f"OP_{c.name}", c.opcode, note=note))
    out = [
        "/* Generated by kvcxl/cxl/guest_header.py from kvcxl/cxl/ring.py; do not edit:",
        f" * {WRITE_COMMAND} */",
        "/* The kvcxl device-memory protocol, guest side; docs/qemu.md describes it.  All",
        " * fields are little-endian; offsets are device physical addresses (DPA) = offsets",
        " * into /dev/dax0.0 = offsets into the media file.  The C functions shared with",
        " * Python are in kvcxl_pattern.h. */",
        "#ifndef KVCXL_RING_H",
        "#define KVCXL_RING_H",
        "",
        "#include <stdint.h>",
        "",
        _section("DPA map"),
        _define("RING_BASE", L.RING_BASE, "ull", "command/completion ring"),
        _define("TRACE_BASE", L.TRACE_BASE, "ull", "trace written by the host"),
        _define("TRACE_SIZE", L.TRACE_SIZE, "ull"),
        _define("XFER_BASE", L.XFER_BASE, "ull", "data-path check area"),
        _define("XFER_H2G", L.XFER_H2G, "ull", "host writes, guest reads"),
        _define("XFER_G2H", L.XFER_G2H, "ull", "guest writes, host reads"),
        _define("XFER_BYTES", L.XFER_BYTES, "ull", "each way"),
        _define("SEED_H2G", L.SEED_H2G, "u", "pattern seed of the host-to-guest buffer"),
        _define("SEED_G2H", L.SEED_G2H, "u", "pattern seed of the guest-to-host buffer"),
        _define("FUZZ_BASE", L.FUZZ_BASE, "ull", "fuzz cases and results"),
        _define("FUZZ_SIZE", L.FUZZ_SIZE, "ull"),
        _define("WIDTHS_BASE", L.WIDTHS_BASE, "ull", "the widths job's bytes"),
        _define("WIDTHS_BYTES", L.WIDTHS_BYTES, "ull"),
        _define("KV_BASE", L.KV_BASE, "ull", "KV entries"),
        _define("BENCH_BYTES", L.BENCH_BYTES, "ull", "the bench job's copy block, at the end"),
        "",
        _section("ring geometry (offsets from KVCXL_RING_BASE)"),
        _magic("RING_MAGIC", L.RING_MAGIC),
        _define("RING_VERSION", L.RING_VERSION, hexa=False),
        _define("DEV_HDR", L.DEV_HDR, note="device-written line"),
        _define("HOST_HDR", L.HOST_HDR, note="guest-written line: doorbell"),
        _define("SQ", L.SQ),
        _define("CQ", L.CQ),
        _define("SLOTS", L.SLOTS),
        _define("DEPTH", L.DEPTH, hexa=False),
        _define("ENTRY", L.ENTRY, hexa=False),
        _define("SLOT_IN", L.SLOT_IN, hexa=False, note="command payload bytes per slot"),
        _define("SLOT_OUT", L.SLOT_OUT, hexa=False, note="response bytes per slot"),
        _define("SLOT_STRIDE", L.SLOT_STRIDE, hexa=False),
        "",
        "/* device status */",
        _define("DEV_OFF", L.DEV_OFF, hexa=False),
        _define("DEV_READY", L.DEV_READY, hexa=False),
        _define("DEV_FAULT", L.DEV_FAULT, hexa=False),
        _define("DEV_STOPPED", L.DEV_STOPPED, hexa=False),
        "/* the TCG plugin's recording, in kvcxl_dev_hdr.tracing */",
        _define("TRACING_NONE", L.TRACING_NONE, hexa=False),
        _define("TRACING_ARMING", L.TRACING_ARMING, hexa=False),
        _define("TRACING_ON", L.TRACING_ON, hexa=False),
        "",
        *decl("kvcxl_dev_hdr"),
        "",
        *decl("kvcxl_host_hdr"),
        "",
        "/* opcodes: RING_COMMANDS.  Commands that mean what a mailbox vendor command means",
        " * share its opcode and input records (cxl/mailbox.py, docs/device.md); ring-only",
        f" * commands use command set {L.RING_SET:02X}h, which the mailbox does not use. */",
        *ops,
        "",
        "/* return codes: those of the CXL mailbox (CXL 3.x table 8-34) */",
        _define("RC_SUCCESS", L.RC_SUCCESS),
        _define("RC_INVALID_INPUT", L.RC_INVALID_INPUT),
        _define("RC_UNSUPPORTED", L.RC_UNSUPPORTED),
        _define("RC_INTERNAL", L.RC_INTERNAL),
        _define("RC_INVALID_PAYLOAD_LENGTH", L.RC_INVALID_PAYLOAD_LENGTH),
        "",
        *decl("kvcxl_sqe"),
        "",
        *decl("kvcxl_cqe"),
        "",
        *decl("kvcxl_open"),
        "",
        *(
            line
            for c in L.RING_COMMANDS
            if c.records is not None
            for line in (*decl(record_struct(c)), "")
        ),
        *decl("kvcxl_victim"),
        "",
        _section("trace area (written by the host before boot)"),
        _magic("TRACE_MAGIC", L.TRACE_MAGIC),
        *decl("kvcxl_trace_hdr"),
        _define("EV_CREATE", L.EV_CREATE, hexa=False, note="records: kvcxl_create_rec"),
        _define("EV_READ", L.EV_READ, hexa=False, note="records: kvcxl_attn_rec"),
        _define("EV_CTX_LEN", L.EV_CTX_LEN, hexa=False, note="records: kvcxl_ctx_len_rec"),
        *decl("kvcxl_trace_batch"),
        "",
        _section("guest fuzz area (written by the host before boot; results by the fuzz job)"),
        _magic("FUZZ_MAGIC", L.FUZZ_MAGIC),
        *decl("kvcxl_fuzz_hdr"),
        *decl("kvcxl_fuzz_case"),
        *decl("kvcxl_fuzz_result"),
        "",
        _section("TCG plugin access ring (a shared-memory file, not device memory)"),
        _magic("ACC_MAGIC", L.ACC_MAGIC),
        _define("ACC_STORE", L.ACC_STORE, note="in kvcxl_acc_rec.size_flags: a store"),
        *decl("kvcxl_acc_hdr"),
        *decl("kvcxl_acc_rec"),
        "",
        *(
            f'_Static_assert(sizeof(struct {name}) == {sum(f[3] for f in fields)}, "{name}");'
            for name, (fields, _) in st.items()
        ),
        "",
        "#endif",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the guest agent's C header.")
    ap.add_argument("path", type=Path, help="where to write it: qemu/guest/kvcxl_ring.h")
    args = ap.parse_args(argv)
    args.path.write_text(render_guest_header())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
