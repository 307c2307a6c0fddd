"""kvcxl.emu.device: the CXL Type-3 memory expander emulator.

``media`` — DRAM and NVMe tiers holding real bytes; ``timing`` — a queue per tier
over the shared tier parameters of :mod:`kvcxl.emu.timing`; ``device`` — the device,
composing ``tiers`` (its media), ``migration`` (pages moving between tiers), ``poison``
(the poison list) and ``front`` (the firmware front), with HDM decoders and the
CXL.mem data path; ``errors`` — the refusal it names; ``cci`` — the mailbox
command handlers; ``service`` — the Unix-socket service; ``soak`` and ``fuzz`` —
integrity and robustness runs; ``bench`` — speed.  ``kvcxl device`` is
:mod:`kvcxl.cli.device`.
"""
