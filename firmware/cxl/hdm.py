"""HDM decoder register encodings (CXL 2.0 §8.2.5.12): the numbers the emulator's
decoders (:mod:`kvcxl.emu.cxl.hdm`) and the RTL front end (:mod:`kvcxl.rtl.hdm`) share.

Base and size count 256 MiB units (register bits 31:28 and up); interleave
granularity IG encodes 256 B << IG (0 … 6 = 16 KiB), interleave ways IW encodes
1 << IW ways (0 … 4 = 16 ways); the position of the device in the set is < ways.
"""

from __future__ import annotations

GRANULE_SHIFT = 28
GRANULE = 1 << GRANULE_SHIFT
"""Base and size registers count in 256 MiB units (bits 31:28 and up)."""
WAYS = (1, 2, 4, 8, 16)
GRANULARITIES = tuple(256 << i for i in range(7))  # 256 B … 16 KiB
GRANULARITY_SHIFT = 8  # log2 of the smallest granularity: IG = 0 is 256 B

IG_BITS = (len(GRANULARITIES) - 1).bit_length()
IW_BITS = (len(WAYS) - 1).bit_length()
POSITION_BITS = (max(WAYS) - 1).bit_length()
