"""faultnet: inject the network failures real networks have, and prove they are in force."""

from faultnet._version import __version__
from faultnet.eventlog import CorruptLogError, JsonlRead, JsonlWriter, read_jsonl
from faultnet.procs import ProcessIdentity, signal_exact

__all__ = [
    "CorruptLogError",
    "JsonlRead",
    "JsonlWriter",
    "ProcessIdentity",
    "__version__",
    "read_jsonl",
    "signal_exact",
]
