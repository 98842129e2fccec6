"""``python -m gluon_data.cli``, as ``gluon-data``."""
import sys

from . import main

sys.exit(main())
