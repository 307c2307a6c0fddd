"""Data layouts of the policy engine's records and streams (Amaranth ``lib.data``).

Every width comes from the Q0.16 contract in :mod:`kvcxl.firmware.fixedpoint`;
the testbench packs and unpacks stream payloads with these same layouts
(:func:`pack` / :func:`unpack`), so a field is defined exactly once.
"""

from __future__ import annotations

from amaranth.hdl import Shape, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig

Q_BITS = fx.FRAC_BITS  # scores, weights, priorities, decay values
ALPHA_BITS = fx.FRAC_BITS + 1  # α ∈ [1, 65536]: 65536 (α = 1) needs one more bit
ALPHA_RESET = fx.alpha_to_q16(PolicyConfig.alpha)  # the α register after reset: the default
IDLE_BITS = fx.IDLE_BITS
TABLE_BITS = fx.DECAY_TABLE_BITS
SHIFT_BITS = 4  # decay_shift ∈ [0, 8] (PolicyConfig)


def record_layout(q_bits: int = Q_BITS, idle_bits: int = IDLE_BITS) -> data.StructLayout:
    """One entry's metadata as stored on chip (its fields: ``fixedpoint.record_fields``)."""
    return data.StructLayout(
        {name: unsigned(bits) for name, bits in fx.record_fields(q_bits, idle_bits).items()}
    )


def update_layout(lanes: int, q_bits: int = Q_BITS) -> data.StructLayout:
    """One sweep beat: the step's weight and read flag of ``lanes`` consecutive entries.

    ``hold`` makes the beat an evaluation: the priority of each entry as it stands within
    the step (score as stored, idle 0 if touched so far, else as stored), nothing written
    back: the eviction pass between two step boundaries."""
    return data.StructLayout(
        {
            "weight": data.ArrayLayout(unsigned(q_bits), lanes),
            "read": unsigned(lanes),
            "hold": unsigned(1),
        }
    )


def step_layout() -> data.StructLayout:
    """A beat on the top's ``step`` stream: which sweep of the weight buffer to run.

    ``hold``: an evaluation sweep (see :func:`update_layout`) for a mid-step eviction pass;
    ``keep``: leave the weight buffer as it is (the step's reads are still to be applied)."""
    return data.StructLayout({"hold": unsigned(1), "keep": unsigned(1)})


def scored_layout(q_bits: int = Q_BITS, idle_bits: int = IDLE_BITS) -> data.StructLayout:
    """One entry after the step: its new record fields and eviction priority."""
    return data.StructLayout(
        {
            "score": unsigned(q_bits),
            "idle": unsigned(idle_bits),
            "priority": unsigned(q_bits),
            "eligible": unsigned(1),
        }
    )


def scored_group_layout(
    lanes: int, addr_bits: int, q_bits: int = Q_BITS, idle_bits: int = IDLE_BITS
) -> data.StructLayout:
    """A beat of the scoring engine's output: ``lanes`` entries starting at ``addr·lanes``."""
    return data.StructLayout(
        {
            "addr": unsigned(max(addr_bits, 1)),
            "last": unsigned(1),  # the sweep's final beat: the eviction pass may start
            "lane": data.ArrayLayout(scored_layout(q_bits, idle_bits), lanes),
        }
    )


def record_write_layout(lanes: int, addr_bits: int, q_bits: int = Q_BITS) -> data.StructLayout:
    """A host write of one memory word (``lanes`` records)."""
    return data.StructLayout(
        {
            "addr": unsigned(max(addr_bits, 1)),
            "data": data.ArrayLayout(record_layout(q_bits), lanes),
        }
    )


def table_write_layout(q_bits: int = Q_BITS) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(TABLE_BITS), "data": unsigned(q_bits)})


def victim_layout(index_bits: int, q_bits: int = Q_BITS) -> data.StructLayout:
    """A beat of the eviction engine's output, in victim order."""
    return data.StructLayout(
        {
            "index": unsigned(max(index_bits, 1)),
            "priority": unsigned(q_bits),
            "last": unsigned(1),  # final victim of the pass
            "empty": unsigned(1),  # the pass found no eligible entry (index/priority void)
        }
    )


# --- packing helpers shared with the testbench -------------------------------------------


def pack(layout: data.Layout, value: dict | list | int) -> int:
    """A nested dict/list of ints to the layout's bit pattern (the Verilog port value)."""
    if isinstance(layout, data.StructLayout):
        out = 0
        for name, field in layout:
            if name in value:
                out |= pack(field.shape, value[name]) << field.offset
        return out
    if isinstance(layout, data.ArrayLayout):
        w = _width(layout.elem_shape)
        out = 0
        for i, v in enumerate(value):
            out |= pack(layout.elem_shape, v) << (i * w)
        return out
    v = int(value)
    w = _width(layout)
    if not 0 <= v < (1 << w):
        raise ValueError(f"value {v} does not fit {w} bits")
    return v


def unpack(layout: data.Layout, bits: int) -> dict | list | int:
    """The inverse of :func:`pack`."""
    if isinstance(layout, data.StructLayout):
        return {
            name: unpack(f.shape, (bits >> f.offset) & ((1 << _width(f.shape)) - 1))
            for name, f in layout
        }
    if isinstance(layout, data.ArrayLayout):
        w = _width(layout.elem_shape)
        return [
            unpack(layout.elem_shape, (bits >> (i * w)) & ((1 << w) - 1))
            for i in range(layout.length)
        ]
    return bits


def unpacker(layout: data.Layout):
    """A fast :func:`unpack` for one layout (offsets resolved once; for per-cycle use)."""
    if isinstance(layout, data.StructLayout):
        parts = [(name, f.offset, unpacker(f.shape)) for name, f in layout]
        return lambda bits: {name: fn(bits >> off) for name, off, fn in parts}
    if isinstance(layout, data.ArrayLayout):
        w, n, fn = _width(layout.elem_shape), layout.length, unpacker(layout.elem_shape)
        return lambda bits: [fn(bits >> (i * w)) for i in range(n)]
    mask = (1 << _width(layout)) - 1
    return lambda bits: bits & mask


def _width(shape) -> int:
    if isinstance(shape, data.Layout):
        return shape.size

    return Shape.cast(shape).width


# --- the slot-queue engine (CLOCK, SIEVE): rtl/slot_queue.py ------------------------------


def slot_cmd_layout(index_bits: int, count_bits: int) -> data.StructLayout:
    """A host command (:class:`kvcxl.firmware.golden_clock.Op`): ``slot`` it acts on; ``arg``
    the offered bit (OFFER) or the victims wanted (WALK); ``keep`` leaves SIEVE's hand where
    it is (WALK)."""
    from kvcxl.firmware.golden_clock import OP_BITS

    return data.StructLayout(
        {
            "op": unsigned(OP_BITS),
            "slot": unsigned(max(index_bits, 1)),
            "arg": unsigned(count_bits),
            "keep": unsigned(1),
        }
    )


def slot_victim_layout(index_bits: int) -> data.StructLayout:
    """A victim of a walk, in eviction order (``empty``: the walk had nothing to evict)."""
    return data.StructLayout(
        {"index": unsigned(max(index_bits, 1)), "last": unsigned(1), "empty": unsigned(1)}
    )


# What a walk did at one slot (the ``visit`` tap): stepped over it (not offered), took one
# off its counter (CLOCK: and moved it to the head; SIEVE: cleared its visited bit), or
# evicted it.
VISIT_SKIP, VISIT_DECREMENT, VISIT_VICTIM = 0, 1, 2
VISIT_PROMOTE = 3  # S3-FIFO (rtl/s3fifo.py): small's slot moved to main's head


def slot_visit_layout(index_bits: int) -> data.StructLayout:
    return data.StructLayout({"slot": unsigned(max(index_bits, 1)), "kind": unsigned(2)})


def slot_engine_members(index_bits: int, arg_bits: int, ref_bits: int, ref_init: int) -> dict:
    """The ports of a slot-queue engine (CLOCK, SIEVE, S3-FIFO): commands in, victims out,
    the ``visit`` tap and the counter's ceiling ``ref_max`` (a level input)."""
    tap = {"valid": Out(1), "payload": Out(slot_visit_layout(index_bits))}
    return {
        "cmd": In(stream.Signature(slot_cmd_layout(index_bits, arg_bits))),
        "victim": Out(stream.Signature(slot_victim_layout(index_bits))),
        "visit": Out(wiring.Signature(tap)),
        "ref_max": In(ref_bits, init=ref_init),
    }
