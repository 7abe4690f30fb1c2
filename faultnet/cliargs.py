"""argparse types that more than one command line takes. A value they refuse is
argparse's usage error: one line, exit 2."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_number"]


def positive_number(text: str) -> float:
    """A finite number greater than 0 (a number of seconds, a factor, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0: {text!r}")
    return value
