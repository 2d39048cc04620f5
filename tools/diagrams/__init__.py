"""The book's drawn diagrams: vector figures (SVG) generated from code.

Run ``.venv/bin/python -m tools.diagrams`` from the repository root to regenerate every
file of ``book/figures/diagrams/``: one SVG per diagram and the manifest
``diagrams.json``, which gives each diagram's chapter, the heading after whose section
it belongs, its caption, its alt text and a suggested display width. (``tools/`` needs
no ``__init__.py``: run from the root, it is a namespace package.)
``tests/book/test_diagrams.py`` checks that the committed files are exactly what the
code makes now, so edit the code, rerun the command and commit both.

Modules: :mod:`.svg` is the small SVG builder (shapes, arrows, text, grids, one
palette, one font stack, the layout checks), :mod:`.catalog` registers the diagrams
and writes them, and the diagrams themselves are grouped by subject:
:mod:`.foundations` (attention, the Transformer block, positions, linear attention,
recurrent, vision and graph attention), :mod:`.tiles` (masks, sparsity and
FlashAttention), :mod:`.decoding` (the KV cache and serving) and :mod:`.parallel`
(attention across devices). Patterns the package computes (masks, block layouts,
shard layouts, ALiBi's biases) are drawn from the package's own functions, so the
pictures stay exact.

A chapter includes a diagram with MyST's figure directive, taking the fields from the
manifest::

    ```{figure} figures/diagrams/flash_tiling.svg
    :alt: <alt>
    :width: <width>%

    <caption>
    ```
"""

from . import decoding, foundations, parallel, tiles
from .catalog import DIAGRAMS, MANIFEST, OUT, Diagram, build, write

# Importing a module registers its diagrams (the manifest lists them in the book's
# order of chapters, catalog.CHAPTERS).
SUBJECTS = (foundations, tiles, decoding, parallel)

__all__ = ["DIAGRAMS", "MANIFEST", "OUT", "Diagram", "build", "write"]
