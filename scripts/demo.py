#!/usr/bin/env python
"""Thin wrapper: same as `gluon-data demo ...`."""
import sys

from gluon_data.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo"] + sys.argv[1:]))
