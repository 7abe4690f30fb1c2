"""``python -m harness.fleet_verify RUN_DIR``: the fleet's verifier, by its first name.

The verifier lives in :mod:`harness.fleet.verify` (``python -m harness.fleet.verify``);
this module keeps the command the README and existing scripts use.
"""

import sys

from harness.fleet.verify import main

if __name__ == "__main__":
    sys.exit(main())
