"""A tiny SVG builder: boxes, arrows, text and grids of cells, written by hand.

Every diagram of the book is a :class:`Drawing` built in page pixels: a drawing
``width`` pixels wide is shown at ``width / 720`` of the 720-pixel page column, so a
font size here is the size a reader sees. The builder writes plain SVG 1.1 with no
fonts, images, scripts or styles of its own beyond attributes, in one fixed
colour-blind-safe palette (Okabe & Ito) and one font stack, and it refuses a drawing
whose text would overlap other text, leave the canvas, or overflow its box.

Text is one line per ``<text>`` element, positioned by its vertical centre
(:meth:`Drawing.text`); its width is measured with the advance widths of DejaVu Sans,
the first font of the stack (the font matplotlib ships), or estimated at 0.6 of the
font size per character where that font cannot be read. Subscripts and superscripts
are Unicode characters (``q·kⱼ``, ``Kᵀ``), which DejaVu Sans covers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"

# Okabe & Ito's palette: distinguishable with every common colour-vision deficiency.
BLUE = "#0072B2"
SKY = "#56B4E9"
GREEN = "#009E73"
ORANGE = "#E69F00"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
YELLOW = "#F0E442"
GREY = "#999999"

INK = "#1a1a1a"  # text and outlines
MUTED = "#595959"  # secondary text: still 7:1 on white
RULE = "#bfbfbf"  # light outlines, grid lines
PAPER = "#ffffff"

# One colour per role, the same in every diagram.
QUERY, KEY, VALUE, OUTPUT = BLUE, ORANGE, GREEN, PURPLE
STATE, HIGHLIGHT, SKIPPED = SKY, VERMILLION, GREY

# Text sizes in page pixels; nothing is drawn below SMALL.
SMALL, BODY, LARGE = 12, 13, 15
# Vertical centre of a line of text above its baseline, as a fraction of the size.
CENTRE = 0.36


def tint(colour: str, amount: float) -> str:
    """``colour`` mixed with white: ``amount`` 1 is the colour, 0 is white."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(255 - (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


class LayoutError(ValueError):
    """Text that overlaps other text, leaves the canvas or overflows its box."""


# --------------------------------------------------------------------------------------
# Measuring text
# --------------------------------------------------------------------------------------
@functools.cache
def _font(bold: bool):
    try:
        import matplotlib
        from matplotlib import ft2font
    except ImportError:  # pragma: no cover - matplotlib is a dependency of attnbook
        return None
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    if not path.exists():  # pragma: no cover
        return None
    font = ft2font.FT2Font(str(path))
    font.set_size(100, 72)  # 100 pixels per em: advances in hundredths of an em
    return font


@functools.cache
def _advance(char: str, bold: bool) -> float:
    """The advance width of ``char`` in ems."""
    font = _font(bold)
    if font is None:  # pragma: no cover
        return 0.6
    from matplotlib import ft2font

    glyph = font.load_char(ord(char), flags=ft2font.LoadFlags.NO_HINTING)
    return glyph.linearHoriAdvance / 65536 / 100


def text_width(s: str, size: float, bold: bool = False) -> float:
    """The width of ``s`` set in DejaVu Sans at ``size`` pixels."""
    return size * sum(_advance(c, bold) for c in s)


@dataclass(frozen=True)
class Extent:
    """The rectangle a line of text covers: ``x0 .. x1`` by ``y0 .. y1``."""

    text: str
    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Extent, slack: float = 0.5) -> bool:
        return (
            self.x0 < other.x1 - slack
            and other.x0 < self.x1 - slack
            and self.y0 < other.y1 - slack
            and other.y0 < self.y1 - slack
        )


def extent(s: str, x: float, y: float, size: float, anchor: str, bold: bool) -> Extent:
    """Where a line of text drawn at ``x`` (by ``anchor``) centred on ``y`` lies."""
    w = text_width(s, size, bold)
    x0 = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return Extent(s, x0, y - size / 2, x0 + w, y + size / 2)


def check_extents(extents: Sequence[Extent], width: float, height: float) -> None:
    """Raise :class:`LayoutError` if a line of text leaves the canvas or overlaps
    another."""
    problems = [
        f"{e.text!r} leaves the {width:g} x {height:g} canvas"
        for e in extents
        if e.x0 < 0 or e.y0 < 0 or e.x1 > width or e.y1 > height
    ]
    for i, a in enumerate(extents):
        problems += [
            f"{a.text!r} overlaps {b.text!r}"
            for b in extents[i + 1 :]
            if a.overlaps(b)
        ]
    if problems:
        raise LayoutError("; ".join(problems))


# --------------------------------------------------------------------------------------
# Writing SVG
# --------------------------------------------------------------------------------------
def num(v: float) -> str:
    """A coordinate as short, stable text: ``12``, ``12.5``, ``12.25``."""
    v = round(float(v), 2)
    if v == int(v):
        return str(int(v))
    return f"{v:.2f}".rstrip("0")


def escape(s: str) -> str:
    """``s`` as XML character data or an attribute value."""
    return (
        s.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
    )


def _attrs(attrs: dict) -> str:
    out = []
    for key, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = num(value)
        out.append(f' {key.rstrip("_").replace("_", "-")}="{escape(str(value))}"')
    return "".join(out)


@dataclass(frozen=True)
class Box:
    """A rectangle drawn on the canvas, for placing what connects to it."""

    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def bottom(self) -> float:
        return self.y + self.h

    @property
    def top_mid(self) -> tuple[float, float]:
        return self.cx, self.y

    @property
    def bottom_mid(self) -> tuple[float, float]:
        return self.cx, self.bottom

    @property
    def left_mid(self) -> tuple[float, float]:
        return self.x, self.cy

    @property
    def right_mid(self) -> tuple[float, float]:
        return self.right, self.cy


class Drawing:
    """An SVG canvas of ``width`` x ``height`` page pixels, on white."""

    def __init__(self, width: float, height: float):
        self.width, self.height = width, height
        self._body: list[str] = []
        self._depth = 1
        self.extents: list[Extent] = []

    # ---- primitives ------------------------------------------------------------------
    def _emit(self, tag: str, attrs: dict, content: str | None = None) -> None:
        pad = "  " * self._depth
        if content is None:
            self._body.append(f"{pad}<{tag}{_attrs(attrs)}/>")
        else:
            self._body.append(f"{pad}<{tag}{_attrs(attrs)}>{content}</{tag}>")

    @contextmanager
    def group(self, **attrs) -> Iterator[None]:
        """Elements drawn inside the ``with`` block share a ``<g>`` and its
        attributes (``stroke``, ``fill``, ``opacity``, ...)."""
        self._body.append(f"{'  ' * self._depth}<g{_attrs(attrs)}>")
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self._body.append(f"{'  ' * self._depth}</g>")

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        *,
        fill: str = "none",
        stroke: str | None = INK,
        width: float = 1.2,
        rx: float = 0,
        dash: str | None = None,
    ) -> Box:
        self._emit(
            "rect",
            {
                "x": x,
                "y": y,
                "width": w,
                "height": h,
                "rx": rx or None,
                "fill": fill,
                "stroke": stroke,
                "stroke_width": width if stroke else None,
                "stroke_dasharray": dash,
            },
        )
        return Box(x, y, w, h)

    def circle(
        self,
        cx: float,
        cy: float,
        r: float,
        *,
        fill: str = PAPER,
        stroke: str | None = INK,
        width: float = 1.2,
        dash: str | None = None,
    ) -> Box:
        self._emit(
            "circle",
            {
                "cx": cx,
                "cy": cy,
                "r": r,
                "fill": fill,
                "stroke": stroke,
                "stroke_width": width if stroke else None,
                "stroke_dasharray": dash,
            },
        )
        return Box(cx - r, cy - r, 2 * r, 2 * r)

    def polygon(
        self,
        points: Sequence[tuple[float, float]],
        *,
        fill: str = INK,
        stroke: str | None = None,
        width: float = 1,
    ) -> None:
        self._emit(
            "polygon",
            {
                "points": " ".join(f"{num(x)},{num(y)}" for x, y in points),
                "fill": fill,
                "stroke": stroke,
                "stroke_width": width if stroke else None,
            },
        )

    def line(
        self,
        *points: tuple[float, float],
        colour: str = INK,
        width: float = 1.4,
        dash: str | None = None,
    ) -> None:
        """A polyline through ``points``."""
        if len(points) < 2:
            raise ValueError("a line needs two points")
        if len(points) == 2:
            (x1, y1), (x2, y2) = points
            attrs = {"x1": x1, "y1": y1, "x2": x2, "y2": y2}
            tag = "line"
        else:
            attrs = {"points": " ".join(f"{num(x)},{num(y)}" for x, y in points)}
            attrs["fill"] = "none"
            tag = "polyline"
        attrs |= {"stroke": colour, "stroke_width": width, "stroke_dasharray": dash}
        if tag == "polyline":
            attrs["stroke_linejoin"] = "round"
        self._emit(tag, attrs)

    def arrow(
        self,
        *points: tuple[float, float],
        colour: str = INK,
        width: float = 1.4,
        head: float = 8,
        dash: str | None = None,
    ) -> None:
        """A polyline through ``points`` with a filled head at the last point."""
        (x1, y1), (x2, y2) = points[-2], points[-1]
        length = math.hypot(x2 - x1, y2 - y1)
        if length <= head:
            raise ValueError(f"arrow segment {points[-2:]} is shorter than its head")
        ux, uy = (x2 - x1) / length, (y2 - y1) / length
        base = (x2 - ux * head, y2 - uy * head)
        half = head * 0.45
        self.line(*points[:-1], base, colour=colour, width=width, dash=dash)
        self.polygon(
            [
                (x2, y2),
                (base[0] - uy * half, base[1] + ux * half),
                (base[0] + uy * half, base[1] - ux * half),
            ],
            fill=colour,
        )

    def path(
        self,
        d: str,
        *,
        fill: str = "none",
        stroke: str | None = INK,
        width: float = 1.4,
        dash: str | None = None,
    ) -> None:
        self._emit(
            "path",
            {
                "d": d,
                "fill": fill,
                "stroke": stroke,
                "stroke_width": width if stroke else None,
                "stroke_dasharray": dash,
            },
        )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        *,
        size: float = BODY,
        anchor: str = "middle",
        bold: bool = False,
        italic: bool = False,
        colour: str = INK,
    ) -> Extent:
        """One line of text centred vertically on ``y``; ``anchor`` places ``x`` at
        its ``start``, ``middle`` or ``end``."""
        if not s:
            raise ValueError("empty text")
        self._emit(
            "text",
            {
                "x": x,
                "y": y + CENTRE * size,
                "font_size": size,
                "text_anchor": None if anchor == "start" else anchor,
                "font_weight": "bold" if bold else None,
                "font_style": "italic" if italic else None,
                "fill": None if colour == INK else colour,
            },
            escape(s),
        )
        e = extent(s, x, y, size, anchor, bold)
        self.extents.append(e)
        return e

    def lines(
        self,
        x: float,
        y: float,
        lines: Sequence[str],
        *,
        size: float = BODY,
        leading: float = 1.3,
        **kwargs,
    ) -> None:
        """Several lines of text, as a block centred vertically on ``y``."""
        top = y - (len(lines) - 1) * size * leading / 2
        for i, s in enumerate(lines):
            self.text(x, top + i * size * leading, s, size=size, **kwargs)

    # ---- composites ------------------------------------------------------------------
    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        label: str | Sequence[str] | None = None,
        *,
        fill: str = PAPER,
        stroke: str | None = INK,
        width: float = 1.2,
        rx: float = 5,
        size: float = BODY,
        bold: bool = False,
        dash: str | None = None,
        colour: str = INK,
    ) -> Box:
        """A (rounded) box with its label centred inside, one line per string; the
        label must fit with a margin."""
        box = self.rect(x, y, w, h, fill=fill, stroke=stroke, width=width, rx=rx,
                        dash=dash)
        if label is None:
            return box
        lines = [label] if isinstance(label, str) else list(label)
        widest = max(text_width(s, size, bold) for s in lines)
        tall = size * (1.3 * (len(lines) - 1) + 1)
        if widest > w - 6 or tall > h - 2:
            raise LayoutError(f"{lines!r} ({widest:.0f} x {tall:.0f}) overflows its "
                              f"{w:g} x {h:g} box")
        self.lines(box.cx, box.cy, lines, size=size, bold=bold, colour=colour)
        return box

    def grid(
        self,
        x: float,
        y: float,
        fills: Sequence[Sequence[str | None]],
        *,
        cell: float,
        cell_h: float | None = None,
        stroke: str = PAPER,
        width: float = 1,
        labels: Sequence[Sequence[str | None]] | None = None,
        size: float = SMALL,
    ) -> Box:
        """A grid of cells, ``fills[row][col]`` their colours (None: white with a
        light outline; ``"none"``: no cell drawn), with optional ``labels`` centred in
        the cells."""
        cell_h = cell if cell_h is None else cell_h
        rows, cols = len(fills), len(fills[0])
        with self.group(stroke_width=width):
            for i, row in enumerate(fills):
                for j, fill in enumerate(row):
                    if fill == "none":
                        continue
                    self._emit(
                        "rect",
                        {
                            "x": x + j * cell,
                            "y": y + i * cell_h,
                            "width": cell,
                            "height": cell_h,
                            "fill": fill or PAPER,
                            "stroke": RULE if fill is None else stroke,
                        },
                    )
        if labels is not None:
            for i, row in enumerate(labels):
                for j, s in enumerate(row):
                    if s:
                        self.text(x + (j + 0.5) * cell, y + (i + 0.5) * cell_h, s,
                                  size=size)
        return Box(x, y, cols * cell, rows * cell_h)

    # ---- output ----------------------------------------------------------------------
    def svg(self, *, name: str, title: str, desc: str) -> str:
        """The finished SVG document: ``role="img"`` with ``<title>`` and ``<desc>``,
        after checking that no text overlaps other text or leaves the canvas."""
        check_extents(self.extents, self.width, self.height)
        w, h = num(self.width), num(self.height)
        head = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" '
            f'width="{w}" height="{h}" role="img" '
            f'aria-labelledby="{name}-title {name}-desc" font-family="{FONT}" '
            f'fill="{INK}">',
            f'  <title id="{name}-title">{escape(title)}</title>',
            f'  <desc id="{name}-desc">{escape(desc)}</desc>',
            f'  <rect width="{w}" height="{h}" fill="{PAPER}"/>',
        ]
        return "\n".join(head + self._body + ["</svg>"]) + "\n"
