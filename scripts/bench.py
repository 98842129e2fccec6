#!/usr/bin/env python
"""Thin wrapper: same as `gluon-data bench ...` (the harness is benchmarks/bench.py)."""
import sys

from gluon_data.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench"] + sys.argv[1:]))
