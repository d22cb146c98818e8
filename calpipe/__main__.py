"""``python -m calpipe``: the ``calpipe`` command (as ``python -m calpipe.cli``)."""

import sys

from calpipe.cli import main

sys.exit(main())
