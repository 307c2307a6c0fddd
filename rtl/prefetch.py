"""PrefetchEngine: the blocks one touch proposes, ranked as docs/policy.md says, in fetch order.

A touch of block ``b`` of (layer ``l``, KV head ``h``) proposes blocks ``b − W … b + W``
(``W`` in blocks, :func:`kvcxl.firmware.fixedpoint.window_blocks`) of head ``h`` in
layers ``l+1 … l+depth`` that exist.  Each candidate's rank is the Q0.16 contract

    rank = (b_rope · RoPE[|b' − b|] + b_score · score + 32768) >> 16

with the RoPE table from :func:`~kvcxl.firmware.fixedpoint.rope_table` and the blend
from :func:`~kvcxl.firmware.fixedpoint.blend_to_q16`; the candidate's score is read
through ``score_rd`` (a synchronous read port: address out, data the next cycle).
Candidates leave on ``cand`` in :func:`kvcxl.firmware.prefetch.order`'s order: rank
descending, entry id ascending.  Entry ids number one context's entries as
``(layer · heads + head) · blocks + block``.

One candidate is generated per cycle and inserted into a sorted register file of
``max_depth · (2·max_window + 1)`` slots (as the eviction engine's top-k); the
sorted list is then streamed out.  ``depth`` and ``window`` are registers no
larger than the maxima the hardware was built for.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from kvcxl.firmware import fixedpoint as fx

from . import layouts as L


class PrefetchEngine(wiring.Component):
    def __init__(
        self,
        layers: int = 8,
        heads: int = 2,
        blocks: int = 16,
        max_window: int = 2,
        max_depth: int = 2,
        rope_init=None,
    ):
        for name, v in (("layers", layers), ("heads", heads), ("blocks", blocks)):
            if v < 1:
                raise ValueError(f"{name} = {v}: must be ≥ 1")
        if max_window < 0 or max_depth < 0:
            raise ValueError("max_window and max_depth must be ≥ 0")
        self.layers, self.heads, self.blocks = layers, heads, blocks
        self.max_window, self.max_depth = max_window, max_depth
        self.slots = max(max_depth * (2 * max_window + 1), 1)
        self.id_bits = max((layers * heads * blocks - 1).bit_length(), 1)
        self.rope_init = [int(v) for v in rope_init] if rope_init is not None else []
        touch = data.StructLayout(
            {
                "layer": unsigned(max((layers - 1).bit_length(), 1)),
                "head": unsigned(max((heads - 1).bit_length(), 1)),
                "block": unsigned(max((blocks - 1).bit_length(), 1)),
            }
        )
        cand = data.StructLayout(
            {
                "id": unsigned(self.id_bits),
                "rank": unsigned(L.Q_BITS),
                "distance": unsigned(max(max_window.bit_length(), 1)),
                "last": unsigned(1),
                "empty": unsigned(1),
            }
        )
        super().__init__(
            {
                "touch": In(stream.Signature(touch)),
                "cand": Out(stream.Signature(cand)),
                "score_addr": Out(self.id_bits),
                "score_en": Out(1),
                "score_data": In(L.Q_BITS),
                "rope_w": In(
                    stream.Signature(
                        data.StructLayout(
                            {
                                "addr": unsigned(max(max_window.bit_length(), 1)),
                                "data": unsigned(L.Q_BITS),
                            }
                        )
                    )
                ),
                "depth": In(range(max_depth + 1), init=max_depth),
                "window": In(range(max_window + 1), init=max_window),
                "blend_rope": In(L.ALPHA_BITS, init=fx.blend_to_q16((0.6, 0.4))[0]),
            }
        )

    def elaborate(self, platform):
        m = Module()
        K, W = self.slots, self.max_window
        m.submodules.rope = rope = Memory(shape=L.Q_BITS, depth=W + 1, init=self.rope_init)
        rwp, rrp = rope.write_port(), rope.read_port()
        m.d.comb += [
            self.rope_w.ready.eq(1),
            rwp.en.eq(self.rope_w.valid),
            rwp.addr.eq(self.rope_w.payload.addr),
            rwp.data.eq(self.rope_w.payload.data),
        ]
        lb = len(self.touch.payload.layer)
        bb = len(self.touch.payload.block)
        t_layer, t_head, t_block = Signal(lb), Signal(len(self.touch.payload.head)), Signal(bb)
        dl = Signal(range(self.max_depth + 2))  # 1 … depth
        db = Signal(range(-W, W + 1))  # −window … window
        # Candidate of this cycle.
        c_layer = Signal(lb + 1)
        c_block = Signal(range(-W, self.blocks + W + 1))
        m.d.comb += [c_layer.eq(t_layer + dl), c_block.eq(t_block + db)]
        exists = Signal()
        m.d.comb += exists.eq((c_layer < self.layers) & (c_block >= 0) & (c_block < self.blocks))
        c_id = Signal(self.id_bits + 1)
        m.d.comb += c_id.eq((c_layer * self.heads + t_head) * self.blocks + c_block[:bb])
        dist = Signal(range(W + 1))
        m.d.comb += dist.eq(Mux(db < 0, -db, db))

        # Stage 2: the score and RoPE value of last cycle's candidate arrive.
        v2, id2, dist2 = Signal(), Signal(self.id_bits), Signal(range(W + 1))
        rank = Signal(L.Q_BITS)
        b_rope = self.blend_rope
        m.d.comb += rank.eq(  # the firmware's kernel (fixedpoint.blend_q16_step)
            fx.blend_q16_step(b_rope, rrp.data, fx.Q_ONE - b_rope, self.score_data)
        )
        m.d.comb += [self.score_addr.eq(c_id), rrp.addr.eq(dist)]

        sv = [Signal(name=f"slot{j}_valid") for j in range(K)]
        sr = [Signal(L.Q_BITS, name=f"slot{j}_rank") for j in range(K)]
        si = [Signal(self.id_bits, name=f"slot{j}_id") for j in range(K)]
        sd = [Signal(range(W + 1), name=f"slot{j}_dist") for j in range(K)]

        def better(j):
            return ~sv[j] | (rank > sr[j]) | ((rank == sr[j]) & (id2 < si[j]))

        with m.If(v2):
            gt = [better(j) for j in range(K)]
            for j in range(K):
                take = gt[j] if j == 0 else gt[j] & ~gt[j - 1]
                with m.If(take):
                    m.d.sync += [sv[j].eq(1), sr[j].eq(rank), si[j].eq(id2), sd[j].eq(dist2)]
                if j > 0:
                    with m.Elif(gt[j - 1]):
                        m.d.sync += [
                            sv[j].eq(sv[j - 1]),
                            sr[j].eq(sr[j - 1]),
                            si[j].eq(si[j - 1]),
                            sd[j].eq(sd[j - 1]),
                        ]
        m.d.sync += v2.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.touch.ready.eq(1)
                with m.If(self.touch.valid):
                    p = self.touch.payload
                    m.d.sync += [
                        t_layer.eq(p.layer),
                        t_head.eq(p.head),
                        t_block.eq(p.block),
                        dl.eq(1),
                        db.eq(-self.window),
                    ]
                    m.next = "GEN"
            with m.State("GEN"):
                with m.If(dl > self.depth):
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += self.score_en.eq(exists)
                    m.d.sync += [v2.eq(exists), id2.eq(c_id), dist2.eq(dist)]
                    with m.If(db == self.window):
                        m.d.sync += [db.eq(-self.window), dl.eq(dl + 1)]
                    with m.Else():
                        m.d.sync += db.eq(db + 1)
            with m.State("DRAIN"):  # the last candidate's insertion completes
                m.next = "EMIT"
            with m.State("EMIT"):
                none = ~sv[0]
                nxt = sv[1] if K > 1 else 0
                last = none | ~nxt
                m.d.comb += [
                    self.cand.valid.eq(1),
                    self.cand.payload.id.eq(Mux(none, 0, si[0])),
                    self.cand.payload.rank.eq(Mux(none, 0, sr[0])),
                    self.cand.payload.distance.eq(Mux(none, 0, sd[0])),
                    self.cand.payload.last.eq(last),
                    self.cand.payload.empty.eq(none),
                ]
                with m.If(self.cand.ready):
                    for j in range(K):
                        if j + 1 < K:
                            m.d.sync += [
                                sv[j].eq(sv[j + 1]),
                                sr[j].eq(sr[j + 1]),
                                si[j].eq(si[j + 1]),
                                sd[j].eq(sd[j + 1]),
                            ]
                        else:
                            m.d.sync += sv[j].eq(0)
                    with m.If(last):
                        m.d.sync += [s.eq(0) for s in sv]
                        m.next = "IDLE"
        return m
