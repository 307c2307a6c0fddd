"""The one figure set-up of every ``kvcxl`` plot: a headless backend, the axes, the file.

matplotlib loads inside :func:`figure` (it is slow to import and most commands never
draw).  The Agg backend draws without a display, as on a build machine or over SSH.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def figure(
    path: str | Path,
    *,
    dpi: float | None = None,
    figure_dpi: float | None = None,
    tight: bool = False,
    **subplots: Any,
) -> Iterator[tuple[Any, Any]]:
    """``with figure(path, figsize=(8, 4)) as (fig, ax):`` draw, and on leaving the block
    the figure is saved to ``path`` (at ``dpi``, default the figure's own; laid out tightly
    when ``tight``) and closed.  ``figure_dpi`` is the figure's own resolution (matplotlib's
    default when None): the tight layout is computed at it, so a plot drawn at 120 dpi keeps
    its exact pixels only if it is made at 120 rather than saved at 120.  ``subplots`` go to
    ``plt.subplots`` (``nrows``, ``ncols``, ``figsize``, ``sharex``, ``squeeze``, ...).
    Nothing is written when drawing raises."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if figure_dpi is not None:
        subplots["dpi"] = figure_dpi
    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        if tight:
            fig.tight_layout()
        fig.savefig(path, **({} if dpi is None else {"dpi": dpi}))
    finally:
        plt.close(fig)
