"""``python -m kvcxl.cli``: the ``kvcxl`` command."""

import sys

from kvcxl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
