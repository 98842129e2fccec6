#!/usr/bin/env python
"""Thin wrapper: the same as ``python benchmarks/bench_uint8.py ...`` (float32 samples vs
uint8 samples + ``InputNormalize`` in the consumer; ``gluon-data bench`` runs it too)."""
import os
import runpy
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.exit(runpy.run_path(os.path.join(here, os.pardir, "benchmarks", "bench_uint8.py"))
             ["main"]())
