"""`python -m fastgrad_bench`: the same as `fastgrad bench`."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))
