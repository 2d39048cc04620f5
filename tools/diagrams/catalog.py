"""The catalogue of diagrams: each one registered with where it goes in the book.

A diagram is a function that returns a :class:`~tools.diagrams.svg.Drawing`, registered
with :func:`diagram` under its file name, the chapter (the notebook's stem in
``book/``), the markdown heading after whose section it belongs (the heading line
exactly as the notebook writes it), a caption that says what to look at (MyST
markdown: ``$...$`` math works), alt text for a screen reader (plain text, a full
description of the picture) and a short title. :func:`build` renders every one, plus
the manifest ``diagrams.json``; :func:`write` puts them in ``book/figures/diagrams/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .svg import Drawing

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "book" / "figures" / "diagrams"
MANIFEST = "diagrams.json"
COLUMN = 720  # the page column, in pixels
# The chapters in the order of _toc.yml: the manifest lists the diagrams in this order
# (and, within a chapter, in the order they are registered).
CHAPTERS = [
    "attention", "inside_attention", "rnn_attention", "transformer", "positional",
    "complexity", "flash", "kernel_lab", "sparse", "linear", "kv_cache", "serving",
    "distributed", "vision_attention", "graph_attention", "connections",
]


@dataclass(frozen=True)
class Diagram:
    name: str
    chapter: str
    after: str
    title: str
    caption: str
    alt: str
    draw: Callable[[], Drawing]
    width: int | None = None  # % of the column; None: the drawing's own pixel width


DIAGRAMS: list[Diagram] = []


def diagram(
    name: str,
    *,
    chapter: str,
    after: str,
    title: str,
    caption: str,
    alt: str,
    width: int | None = None,
) -> Callable[[Callable[[], Drawing]], Callable[[], Drawing]]:
    """Register the decorated drawing function as the diagram ``name``."""

    def register(draw: Callable[[], Drawing]) -> Callable[[], Drawing]:
        if any(d.name == name for d in DIAGRAMS):
            raise ValueError(f"two diagrams are named {name!r}")
        if chapter not in CHAPTERS:
            raise ValueError(f"{name}: no chapter {chapter!r} in {CHAPTERS}")
        DIAGRAMS.append(
            Diagram(name, chapter, after, title, " ".join(caption.split()),
                    " ".join(alt.split()), draw, width)
        )
        return draw

    return register


def display_width(d: Diagram, drawing: Drawing) -> int:
    """The suggested width in % of the column: by default the drawing's pixel width,
    so that its sizes are page pixels."""
    if d.width is not None:
        return d.width
    return min(100, math.ceil(100 * drawing.width / COLUMN))


def build() -> dict[str, str]:
    """Every file of ``book/figures/diagrams/``: name -> text."""
    files, manifest = {}, []
    for d in sorted(DIAGRAMS, key=lambda d: CHAPTERS.index(d.chapter)):
        drawing = d.draw()
        files[f"{d.name}.svg"] = drawing.svg(name=d.name, title=d.title, desc=d.alt)
        manifest.append(
            {
                "name": d.name,
                "file": f"{d.name}.svg",
                "chapter": d.chapter,
                "after": d.after,
                "title": d.title,
                "caption": d.caption,
                "alt": d.alt,
                "width": display_width(d, drawing),
            }
        )
    files[MANIFEST] = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    return files


def write(out: Path = OUT) -> list[str]:
    """Write every file into ``out``, removing SVGs no diagram makes any more; returns
    the names written."""
    files = build()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.svg"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8", newline="\n")
    return sorted(files)
