"""HDM decoders of a CXL Type-3 endpoint: programming, commit/lock, HPA → DPA.

Modelled on the HDM Decoder Capability Structure (CXL 2.0 §8.2.5.12): each decoder
has a base and size in host physical address space (HPA), an interleave
granularity (IG, 256 B … 16 KiB) and interleave ways (IW, 1/2/4/8/16), the
position of this device in the interleave set, and is committed before it
decodes.  A committed decoder with ``lock`` set refuses reprogramming until reset
(Lock On Commit).  Decoders claim device physical address (DPA) space in order:
decoder ``n``'s DPA range starts where decoder ``n − 1``'s ends, plus its DPA skip.

Translation of an HPA inside decoder ``d`` (offset ``o = hpa − base``)::

    way   = (o // IG) % IW           -- which device of the set owns the granule
    dpa   = d.dpa_base + (o // (IG·IW))·IG + o % IG      (only if way == position)

An HPA outside every committed decoder, or owned by another device of the set,
does not translate (``None``); the device answers such an access with an error
response (MemData-NXM for reads), never an exception.

Programming errors raise :class:`HdmError` whose ``reason`` names the rule broken.
Sizes and bases are multiples of 256 MiB as the register fields require.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- the register encodings (CXL 2.0 §8.2.5.12), shared with the RTL front end ---------
# Base and size count 256 MiB units (register bits 31:28 and up); interleave granularity
# IG encodes 256 B << IG (0 … 6 = 16 KiB), interleave ways IW encodes 1 << IW ways
# (0 … 4 = 16 ways); the position of the device in the set is < ways.
GRANULE_SHIFT = 28
GRANULE = 1 << GRANULE_SHIFT
"""Base and size registers count in 256 MiB units (bits 31:28 and up)."""
WAYS = (1, 2, 4, 8, 16)
GRANULARITIES = tuple(256 << i for i in range(7))  # 256 B … 16 KiB
GRANULARITY_SHIFT = 8  # log2 of the smallest granularity: IG = 0 is 256 B

IG_BITS = (len(GRANULARITIES) - 1).bit_length()
IW_BITS = (len(WAYS) - 1).bit_length()
POSITION_BITS = (max(WAYS) - 1).bit_length()


def encode_ways(ways: int) -> int:
    """The IW register encoding of ``ways`` (0 = 1 way … 4 = 16 ways)."""
    if ways not in WAYS:
        raise HdmError("bad_ways", f"interleave ways = {ways} must be one of {WAYS}")
    return WAYS.index(ways)


def encode_granularity(granularity: int) -> int:
    """The IG register encoding of ``granularity`` bytes (0 = 256 B … 6 = 16 KiB)."""
    if granularity not in GRANULARITIES:
        raise HdmError(
            "bad_granularity",
            f"interleave granularity = {granularity} B must be one of {GRANULARITIES}",
        )
    return GRANULARITIES.index(granularity)


class HdmError(ValueError):
    """A decoder programming request the hardware would refuse; ``reason`` names the rule."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class HdmDecoder:
    """One decoder's registers and state."""

    index: int
    base: int = 0
    size: int = 0
    ways: int = 1
    granularity: int = 256
    position: int = 0
    dpa_skip: int = 0
    lock: bool = False
    committed: bool = False
    dpa_base: int = 0  # assigned on commit

    @property
    def dpa_size(self) -> int:
        return self.size // self.ways

    def contains(self, hpa: int) -> bool:
        return self.committed and self.base <= hpa < self.base + self.size


class HdmDecoderSet:
    """The decoders of one endpoint over ``dpa_capacity`` bytes of device memory."""

    def __init__(self, dpa_capacity: int, count: int = 4) -> None:
        if dpa_capacity <= 0 or dpa_capacity % GRANULE:
            raise HdmError(
                "bad_capacity",
                f"device capacity = {dpa_capacity} must be a positive multiple of 256 MiB",
            )
        if not 1 <= count <= 32:
            raise HdmError("bad_count", f"decoder count = {count} must be 1 … 32")
        self.dpa_capacity = dpa_capacity
        self.decoders = [HdmDecoder(i) for i in range(count)]
        self._active: list[HdmDecoder] = []  # committed, sorted by base (fast lookup)

    # --- programming ------------------------------------------------------------
    def program(
        self,
        index: int,
        *,
        base: int,
        size: int,
        ways: int = 1,
        granularity: int = 256,
        position: int = 0,
        dpa_skip: int = 0,
        lock: bool = False,
    ) -> HdmDecoder:
        """Write a decoder's registers (it must not be committed)."""
        d = self._decoder(index)
        if d.committed:
            raise HdmError("committed", f"decoder {index} is committed: uncommit it first")
        encode_ways(ways)
        encode_granularity(granularity)
        for name, v in (("base", base), ("size", size), ("dpa_skip", dpa_skip)):
            if v < 0 or v % GRANULE:
                raise HdmError("misaligned", f"{name} = {v:#x} must be a multiple of 256 MiB")
        if size == 0:
            raise HdmError("bad_size", f"decoder {index}: size must be > 0")
        if size % (GRANULE * ways):
            raise HdmError("bad_size", f"size = {size:#x} must be a multiple of {ways} × 256 MiB")
        if not 0 <= position < ways:
            raise HdmError("bad_position", f"position = {position} must be 0 … {ways - 1}")
        if base + size > 1 << 52:
            raise HdmError("bad_base", f"base + size = {base + size:#x} exceeds the 52-bit HPA")
        d.base, d.size, d.ways, d.granularity = base, size, ways, granularity
        d.position, d.dpa_skip, d.lock = position, dpa_skip, lock
        return d

    def commit(self, index: int) -> HdmDecoder:
        """Commit a programmed decoder; checks order, overlap and DPA capacity."""
        d = self._decoder(index)
        if d.committed:
            return d
        if d.size == 0:
            raise HdmError("not_programmed", f"decoder {index} has size 0")
        if index and not self.decoders[index - 1].committed:
            raise HdmError("order", f"decoder {index - 1} must be committed before {index}")
        prev = self.decoders[index - 1] if index else None
        dpa_base = (prev.dpa_base + prev.dpa_size if prev else 0) + d.dpa_skip
        if prev is not None and d.base < prev.base + prev.size:
            raise HdmError(
                "order", f"decoder {index} base {d.base:#x} is below decoder {index - 1}'s end"
            )
        if dpa_base + d.dpa_size > self.dpa_capacity:
            raise HdmError(
                "capacity",
                f"decoder {index} needs DPA up to {dpa_base + d.dpa_size:#x}, "
                f"device has {self.dpa_capacity:#x}",
            )
        d.dpa_base = dpa_base
        d.committed = True
        self._active = sorted((x for x in self.decoders if x.committed), key=lambda x: x.base)
        return d

    def uncommit(self, index: int) -> None:
        """Clear commit (refused when locked or when a later decoder is still committed)."""
        d = self._decoder(index)
        if d.lock and d.committed:
            raise HdmError("locked", f"decoder {index} is locked until reset")
        if index + 1 < len(self.decoders) and self.decoders[index + 1].committed:
            raise HdmError("order", f"uncommit decoder {index + 1} first")
        d.committed = False
        self._active = [x for x in self._active if x is not d]

    def reset(self) -> None:
        """Conventional reset: every decoder back to uncommitted and unlocked."""
        self.decoders = [HdmDecoder(i) for i in range(len(self.decoders))]
        self._active = []

    def _decoder(self, index: int) -> HdmDecoder:
        if not 0 <= index < len(self.decoders):
            raise HdmError(
                "bad_index", f"decoder index {index} out of range 0 … {len(self.decoders) - 1}"
            )
        return self.decoders[index]

    # --- decoding ---------------------------------------------------------------
    def find(self, hpa: int) -> HdmDecoder | None:
        for d in self._active:
            if d.base <= hpa < d.base + d.size:
                return d
        return None

    def translate(self, hpa: int) -> int | None:
        """DPA of ``hpa`` on this device, or None when no committed decoder maps it here."""
        d = self.find(hpa)
        if d is None:
            return None
        o = hpa - d.base
        g = d.granularity
        if d.ways == 1:
            return d.dpa_base + o
        if (o // g) % d.ways != d.position:
            return None
        return d.dpa_base + (o // (g * d.ways)) * g + o % g

    def chunks(self, hpa: int, length: int) -> list[tuple[int, int, int] | tuple[int, None, int]]:
        """Split ``[hpa, hpa+length)`` at granule and decoder edges.

        Returns ``(hpa, dpa or None, n)`` pieces; a piece with ``None`` is not mapped
        to this device.
        """
        out: list = []
        if length <= 0:  # no byte: no piece (an empty range at a decoder's end maps nothing)
            return out
        end = hpa + length
        act = self._active
        if len(act) == 1:  # fast path: one decoder, the whole range inside it
            d = act[0]
            o = hpa - d.base
            g = d.granularity
            if 0 <= o and end <= d.base + d.size:
                if d.ways == 1:
                    return [(hpa, d.dpa_base + o, length)]
                if o // g == (o + length - 1) // g:
                    dpa = (
                        d.dpa_base + (o // (g * d.ways)) * g + o % g
                        if (o // g) % d.ways == d.position
                        else None
                    )
                    return [(hpa, dpa, length)]
        while hpa < end:
            d = self.find(hpa)
            if d is None:
                # Unmapped: run to the next decoder's base (or the end).
                nxt = min((x.base for x in self._active if x.base > hpa), default=end)
                n = min(end, nxt) - hpa
                out.append((hpa, None, n))
                hpa += n
                continue
            o = hpa - d.base
            if d.ways == 1:
                n = min(end, d.base + d.size) - hpa
                out.append((hpa, d.dpa_base + o, n))
            else:
                g = d.granularity
                n = min(end - hpa, g - o % g)
                dpa = (
                    d.dpa_base + (o // (g * d.ways)) * g + o % g
                    if (o // g) % d.ways == d.position
                    else None
                )
                out.append((hpa, dpa, n))
            hpa += n
        return out

    def describe(self) -> list[dict]:
        return [
            {
                "index": d.index,
                "base": d.base,
                "size": d.size,
                "ways": d.ways,
                "granularity": d.granularity,
                "position": d.position,
                "dpa_base": d.dpa_base,
                "committed": d.committed,
                "lock": d.lock,
            }
            for d in self.decoders
        ]
