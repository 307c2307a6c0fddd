"""The process-memory helpers: numpy's huge-page advice is off once the emulator is
imported, unless the user set NUMPY_MADVISE_HUGEPAGE (docs/simulator.md,
"Huge pages and first-touched memory")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# numpy's setter returns the advice it replaces: read it, in a fresh process, after the
# import that should have set it
_READ = "import numpy as np, kvcxl.emu; print(int(np._core.multiarray._set_madvise_hugepage(True)))"


@pytest.mark.parametrize(("env", "advice"), [(None, 0), ("1", 1), ("0", 0)])
def test_the_emulator_turns_numpys_huge_page_advice_off_unless_told(env, advice) -> None:
    e = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env is not None:
        e["NUMPY_MADVISE_HUGEPAGE"] = env
    out = subprocess.run(
        [sys.executable, "-c", _READ], env=e, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(advice)
