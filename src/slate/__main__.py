"""``python -m slate``: the same as the ``slate`` console script."""

import sys

from slate.cli import main

sys.exit(main())
