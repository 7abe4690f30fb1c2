"""``python -m harness.bench`` (what ``scripts/bench`` runs)."""

import sys

from harness.bench._cli import main

sys.exit(main())
