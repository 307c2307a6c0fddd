"""kvcxl.emu.device: the CXL Type-3 memory expander emulator.

``media`` — DRAM and NVMe tiers holding real bytes; ``timing`` — a queue per tier
over the shared tier parameters of :mod:`kvcxl.emu.timing`; ``device`` — the device
(HDM decoders, media, poison, firmware policy, CXL.mem); ``cci`` — the mailbox
command handlers; ``service`` — the Unix-socket service; ``soak`` and ``fuzz`` —
integrity and robustness runs; ``bench`` — speed; ``commands`` — ``kvcxl device``.
"""
