#!/usr/bin/env python
"""Thin wrapper: same as `gluon-data bench ...` (see gluon_data/bench.py)."""
import sys

from gluon_data.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
