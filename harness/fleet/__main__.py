"""``python -m harness.fleet``: the fleet soak (see :mod:`harness.fleet`)."""

import sys

from harness.fleet._run import main

if __name__ == "__main__":
    sys.exit(main())
