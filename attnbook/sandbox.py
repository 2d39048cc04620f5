"""Moved to :mod:`attnbook.course.sandbox`: the course kit is a subpackage beside the
library. This name works for one release and warns."""

import sys
import warnings

from .course import sandbox as _moved

warnings.warn(
    "attnbook.sandbox moved to attnbook.course.sandbox; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
