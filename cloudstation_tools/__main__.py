"""`python -m cloudstation_tools <command>`: the same command line as `cloudstation` and `python -m infra`."""
import gc
import sys

from cloudstation_tools.cli import main

if __name__ == "__main__":
    status = main()
    gc.freeze()  # as infra/__main__.py: skip the exit-time collections
    sys.exit(status)
