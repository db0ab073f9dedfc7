"""``python -m data_prep.cocostuff``: see ``data_prep.cocostuff.cli``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
