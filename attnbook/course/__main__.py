"""``python -m attnbook.course``: the course kit's command line."""

import sys

from .cli import main

sys.exit(main())
