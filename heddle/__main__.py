"""`python -m heddle ...` is the `heddle` command."""

import sys

from heddle.cli import main

sys.exit(main())
