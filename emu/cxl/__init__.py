"""kvcxl.emu.cxl: CXL protocol definitions, one module per protocol role.

``mem`` — CXL.mem messages (M2S Req/RwD, S2M NDR/DRS); ``hdm`` — HDM decoders;
``mailbox`` — the CCI mailbox command set and return codes.
"""
