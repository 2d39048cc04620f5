"""Moved to :mod:`attnbook.course.grader`: the course kit is a subpackage beside the
library. This name works for one release and warns."""

import sys
import warnings

from .course import grader as _moved

warnings.warn(
    "attnbook.grader moved to attnbook.course.grader; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
