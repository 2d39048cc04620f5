"""Bad-input rows of attnbook.widgets (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.widgets import rope_rotation_explorer, softmax_temperature_explorer

_NAN = float("nan")

ROWS = [
    Bad("softmax_temperature_explorer", "nan", lambda: softmax_temperature_explorer(temperatures=(1.0, _NAN)),
        ("softmax_temperature_explorer", "temperatures")),
    Bad("softmax_temperature_explorer", "zero", lambda: softmax_temperature_explorer(temperatures=(0.0,)),
        ("softmax_temperature_explorer", "temperatures")),
    Bad("softmax_temperature_explorer", "empty", lambda: softmax_temperature_explorer(temperatures=()),
        ("softmax_temperature_explorer", "temperatures")),
    Bad("softmax_temperature_explorer", "wrong-type", lambda: softmax_temperature_explorer(temperatures=("1",)),
        ("softmax_temperature_explorer", "temperatures")),
    Bad("softmax_temperature_explorer", "boolean", lambda: softmax_temperature_explorer(torch.tensor([True, False])),
        ("softmax_temperature_explorer", "scores")),
    Bad("softmax_temperature_explorer", "wrong-shape", lambda: softmax_temperature_explorer(torch.ones(2, 3)),
        ("softmax_temperature_explorer", "scores")),
    Bad("softmax_temperature_explorer", "nan", lambda: softmax_temperature_explorer([1.0, _NAN]),
        ("softmax_temperature_explorer", "scores")),
    Bad("softmax_temperature_explorer", "wrong-type", lambda: softmax_temperature_explorer("abc"),
        ("softmax_temperature_explorer", "scores")),
    Bad("rope_rotation_explorer", "non-integer", lambda: rope_rotation_explorer(pairs=((0, 1.5),)),
        ("rope_rotation_explorer", "pairs")),
    Bad("rope_rotation_explorer", "negative", lambda: rope_rotation_explorer(pairs=((-1, 2),)),
        ("rope_rotation_explorer", "pairs")),
    Bad("rope_rotation_explorer", "empty", lambda: rope_rotation_explorer(pairs=()), ("rope_rotation_explorer", "pairs")),
    Bad("rope_rotation_explorer", "wrong-shape", lambda: rope_rotation_explorer(q=(1.0, 0.0, 0.0)),
        ("rope_rotation_explorer", "q and k")),
    Bad("rope_rotation_explorer", "wrong-shape", lambda: rope_rotation_explorer(pairs=((0, 1, 2),)),
        ("rope_rotation_explorer", "pairs")),
]
EXEMPT = {"DEFAULT_SCORES": "a constant tensor"}
