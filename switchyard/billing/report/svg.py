"""Matplotlib figures to SVG markup fit to inline in one HTML page, without pyplot.

Figures are built on `matplotlib.figure.Figure` with the SVG canvas, so no GUI backend is chosen,
no figure is registered anywhere, and nothing global changes between calls. Every id in a figure
gets the figure's prefix (matplotlib names glyphs and clip paths the same way in every figure),
the metadata block goes, and the data's drawn artists carry `<prefix>-mark-<n>` ids so a browser
can check that each plot drew something. The same figure always gives the same markup.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterable

import matplotlib
from matplotlib.artist import Artist
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

MARK = "mark"
# Matplotlib shares caches and registries (fonts, text layout, unit converters) between figures:
# one report draws at a time, whichever thread it runs on.
DRAW_LOCK = threading.Lock()
_ID = re.compile(r'\bid="([^"]+)"')
_HREF = re.compile(r'href="#([^"]+)"')
_URL = re.compile(r"url\(#([^)]+)\)")
_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def new_figure(width_in: float = 9.0, height_in: float = 3.6) -> Figure:
    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasSVG(figure)
    return figure


class Marks:
    """Names the artists that draw data (bars, lines, areas) `mark-1`, `mark-2`, …"""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, artists: Artist | Iterable[Artist]) -> None:
        for artist in [artists] if isinstance(artists, Artist) else artists:
            self.count += 1
            artist.set_gid(f"{MARK}-{self.count}")


def to_svg(figure: Figure, prefix: str) -> str:
    """The figure as an `<svg>` element whose ids all start with `prefix-`."""
    buffer = io.StringIO()
    # A fixed salt: clip-path ids follow from the figure alone, so one ledger always gives one page.
    with matplotlib.rc_context({"svg.hashsalt": "switchyard-report"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    figure.clear()
    svg = _METADATA.sub("", _PROLOGUE.sub("", buffer.getvalue(), count=1), count=1)
    svg = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = _HREF.sub(lambda m: f'href="#{prefix}-{m.group(1)}"', svg)
    svg = _URL.sub(lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    return svg.strip()


def plain(label: str) -> str:
    """A label matplotlib shows as written: no mathtext from `$`, not hidden from the legend by `_`."""
    label = label.replace("$", r"\$")
    return " " + label if label.startswith("_") else label
