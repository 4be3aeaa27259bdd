"""The figures' one home for matplotlib's set-up and the PNG writes (report, replay, frontier, forecast).

matplotlib comes with the ``dashboard`` extra (hpo/extras.py), so it is imported only when a figure is drawn:
`pyplot` sets the Agg backend (files only, no display) and hands back ``matplotlib.pyplot``; `save_png`
writes a figure atomically and closes it; `png_bytes` gives the PNG as bytes for a caller that writes several
files all or nothing. This module imports nothing else of hpo/ (tests/test_layering.py), so every room that
draws may use it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from collapse_hpo.predictors.atomic import atomic_write_path


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (ModuleNotFoundError without matplotlib: check first with
    hpo/extras.py's ``require`` or ``missing_note``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | os.PathLike[str], *, dpi: int) -> None:
    """Write ``fig`` to ``path`` as a PNG at ``dpi`` dots per inch, atomically (a reader sees the old file or
    the whole new one; predictors/atomic.py), then close it, also when the write failed."""
    try:
        with atomic_write_path(Path(path)) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        pyplot().close(fig)


def png_bytes(fig: Any, *, dpi: int, **savefig: Any) -> bytes:
    """``fig`` as PNG bytes at ``dpi`` dots per inch (``savefig``: more keywords of matplotlib's ``savefig``,
    e.g. ``bbox_inches="tight"``), then close it, also when drawing failed."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, **savefig)
    finally:
        pyplot().close(fig)
    return buf.getvalue()
