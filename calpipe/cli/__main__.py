"""``python -m calpipe.cli``: the ``calpipe`` command."""

import sys

from calpipe.cli import main

sys.exit(main())
