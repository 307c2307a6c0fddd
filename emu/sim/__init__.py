"""kvcxl.emu.sim: the three-tier simulator and what only it uses.

``simulator`` — one run: a compiled read stream replayed through the firmware session
per policy and budget; ``tiers`` — where each entry lives (HBM, CXL DRAM, NVMe) and the
bytes moved between them; ``sweep`` — seeds × policies × budgets in parallel, the figures
of docs/results.md; ``export`` — a stream as libCacheSim CSV / oracleGeneral;
``bench`` — replay speed beside libCacheSim.  Its commands (``kvcxl simulate``,
``sizing``, ``demo`` and ``trace``) are :mod:`kvcxl.cli.sim`.
"""
