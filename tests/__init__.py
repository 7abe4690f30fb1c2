"""faultnet's test suite, laid out as the packages it tests."""

from pathlib import Path

#: The checkout's root directory (scripts/, pyproject.toml, the packages).
REPO = Path(__file__).resolve().parent.parent
