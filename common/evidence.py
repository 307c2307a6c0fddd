"""The evidence classes every published figure carries (the seed's §K.1; docs/evidence.md).

Three classes name what this project's own work produced; three name a number taken from
elsewhere and used as an input; the seventh marks a number that is never a result.
Ordered as the seed orders them, strongest evidence first within each group.
"""

from __future__ import annotations

import re

MEASURED = "Measured"  # run on named hardware here, method and raw data published
SIMULATED = "Simulated"  # this project's simulator or an HDL simulator (trace-driven)
ANALYTICAL = "Analytical model"  # derived from stated inputs, reproducible on paper
#: What this project's own runs and arithmetic produce.
RESULTS = (MEASURED, SIMULATED, ANALYTICAL)

VENDOR = "Vendor specification"  # copied from a product datasheet or a standard
LITERATURE = "External literature"  # a third party's published result, not reproduced
DESIGN_TARGET = "Design target"  # desired, not demonstrated (the seed's own figures)
#: Inputs taken from elsewhere: the citation labels the input, never the output derived
#: from it (that is Analytical model or Simulated).
INPUTS = (VENDOR, LITERATURE, DESIGN_TARGET)

ILLUSTRATIVE = "Illustrative"  # pedagogical (worked examples), never a result

CLASSES = (*RESULTS, *INPUTS, ILLUSTRATIVE)

# A class is named with its capital (prose's lower-case "measured" names no class).
_NAMED = re.compile(r"\b(" + "|".join(re.escape(c) for c in CLASSES) + r")\b")


def classes_in(text: str) -> list[str]:
    """Every evidence class ``text`` names, in order of appearance."""
    return _NAMED.findall(text)


def check(name: str) -> str:
    """``name`` if it is one of :data:`CLASSES`, else a clear error naming it."""
    if name not in CLASSES:
        raise ValueError(f"evidence class {name!r} is unknown: must be one of {', '.join(CLASSES)}")
    return name
