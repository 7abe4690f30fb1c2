"""faultnet's pytest plugin (entry point ``faultnet``): fixtures for trio tests.

Loaded into every pytest run in an environment where faultnet is installed, so importing
it must stay cheap and must never fail: everything heavy is imported inside fixtures.
"""

from __future__ import annotations
