import sys

from .cli import main

if __name__ == "__main__":  # processes spawned by multiprocessing import this module too
    sys.exit(main())
