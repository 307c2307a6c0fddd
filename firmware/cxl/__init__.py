"""kvcxl.firmware.cxl: the CXL protocol tables, one module per protocol.

``mem`` — CXL.mem messages (M2S Req/RwD, S2M NDR/DRS): classes, fields, widths,
opcodes, byte encoding; ``mailbox`` — the CCI mailbox command table, return codes and
message framing; ``hdm`` — the HDM decoder register encodings (units, IG, IW).  They
are data and their encoding only (standard library and numpy), so the emulator, the
RTL and the virtual host all import them from here; the device behaviour (HDM
decoders, mailbox handlers) lives in ``kvcxl.emu``.
"""
