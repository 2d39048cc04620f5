"""Bad-input rows of attnbook.utils (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import os

from test_bad_input import Bad

from attnbook.utils import (
    check_positive,
    default_device,
    glue,
    gpu_report,
    largest_new_tensor,
    seed_everything,
    show_source,
)


def _device_from_env(name: str):
    old = os.environ.get("ATTNBOOK_DEVICE")
    os.environ["ATTNBOOK_DEVICE"] = name
    try:
        return default_device()
    finally:
        if old is None:
            del os.environ["ATTNBOOK_DEVICE"]
        else:
            os.environ["ATTNBOOK_DEVICE"] = old


def _example(x):
    return x + 1


ROWS = [
    Bad("gpu_report", "wrong-type", lambda: gpu_report(3), ("gpu_report", "device")),
    Bad("gpu_report", "out-of-range", lambda: gpu_report("no-such-gpu", folder=os.path.dirname(__file__)),
        ("gpu_report", "device")),
    Bad("seed_everything", "non-integer", lambda: seed_everything(2.5), ("seed_everything", "seed")),
    Bad("seed_everything", "negative", lambda: seed_everything(-1), ("seed_everything", "seed")),
    Bad("seed_everything", "boolean", lambda: seed_everything(True), ("seed_everything", "seed")),
    Bad("seed_everything", "out-of-range", lambda: seed_everything(2**40), ("seed_everything", "seed")),
    Bad("default_device", "wrong-type", lambda: _device_from_env("gpu0"), ("default_device", "ATTNBOOK_DEVICE")),
    Bad("show_source", "wrong-type", lambda: show_source(len), ("show_source", "obj")),
    Bad("show_source", "wrong-type", lambda: show_source("attnbook.core"), ("show_source", "obj")),
    Bad("show_source", "wrong-type", lambda: show_source(_example, 3), ("show_source", "start")),
    Bad("show_source", "out-of-range", lambda: show_source(_example, "nope"), ("show_source", "nope")),
    Bad("show_source", "wrong-type", lambda: show_source(_example, docstring="no"), ("show_source", "docstring")),
    Bad("largest_new_tensor", "wrong-type", lambda: largest_new_tensor(None), ("largest_new_tensor", "fn")),
    Bad("check_positive", "non-integer", lambda: check_positive(block=2.5), ("check_positive", "block")),
    Bad("check_positive", "zero", lambda: check_positive("Cache", window=0), ("Cache", "window")),
    Bad("check_positive", "boolean", lambda: check_positive(block=True), ("check_positive", "block")),
    Bad("check_positive", "wrong-type", lambda: check_positive(3, block=2), ("check_positive", "fn")),
    Bad("glue", "wrong-type", lambda: glue(3, 1.0), ("glue", "name")),
    Bad("glue", "empty", lambda: glue("", 1.0), ("glue", "name")),
    Bad("glue", "out-of-range", lambda: glue("two words", 1.0), ("glue", "name")),
    Bad("glue", "wrong-type", lambda: glue("ops", 1.0, display="yes"), ("glue", "display")),
]
EXEMPT = {"single_thread": "a context manager that takes no argument"}
