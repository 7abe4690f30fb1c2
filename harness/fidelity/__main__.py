"""``python -m harness.fidelity``: see :mod:`harness.fidelity.cli`."""

import sys

from harness.fidelity.cli import main

sys.exit(main())
