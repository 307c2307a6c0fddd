"""The one progress bar of every ``kvcxl`` command.

A bar goes to stderr (stdout carries the command's result: a table, a JSON document a script
pipes on), clears itself when done, appears only after half a second, and is drawn only on a
terminal: in a log or under a test it would be noise.  tqdm loads inside :func:`progress`
(about 20 ms) so that importing a command module stays cheap.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def progress(
    total: int, desc: str, unit: str, *, initial: int = 0, off: bool = False
) -> tuple[Any, Callable[[int], object]]:
    """``(bar, update)``: a tqdm bar of ``total`` ``unit``\\ s (``initial`` already done) and
    its ``update(n)``.  The bar is disabled (both stay callable, and do nothing) when ``off``,
    when there is at most one unit, or when stderr is not a terminal."""
    from tqdm import tqdm

    quiet = off or total <= 1 or not sys.stderr.isatty()
    bar = tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        delay=0.5,
        disable=quiet,
    )
    return bar, bar.update
