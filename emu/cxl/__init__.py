"""kvcxl.emu.cxl: CXL device behaviour of the emulator.

``hdm`` — HDM decoders (programming, commit/lock, HPA → DPA).  The protocol tables
(CXL.mem messages, the mailbox command table) are in :mod:`kvcxl.firmware.cxl`.
"""
