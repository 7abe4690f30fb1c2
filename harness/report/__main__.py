"""``python -m harness.report RUN_DIR``: the same command as ``faultnet report``."""

import sys

from harness.report.cli import main

sys.exit(main())
