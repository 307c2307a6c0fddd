"""The bounded checks ``kvcxl rtl formal`` runs and the defects each must catch.

Standard library only, so that the command line can list them without loading
Amaranth; the harnesses are in :mod:`kvcxl.rtl.formal`.
"""

from __future__ import annotations

CHECKS = ("eviction", "scoring", "frontend", "hdm")
DEFECTS = {
    # planted defect: the check that must catch it
    "tie_off_by_one": "eviction",
    "ignore_pinned": "scoring",
    "lose_request": "frontend",
    "drop_on_stall": "frontend",
    "duplicate_response": "frontend",
    "mis_interleave": "hdm",
}
