"""``python -m gluon_data.cli``, as ``gluon-data``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
