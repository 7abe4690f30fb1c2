"""What a proxy or toxic name may be: anything that can be created can also be listed,
addressed in a URL path, logged and deleted.

A name is 1 to :data:`MAX_NAME_CHARS` characters of valid Unicode (no lone surrogate:
it cannot be encoded, so every answer and record that holds it would fail), without
``/`` (a path separator even when quoted: Starlette decodes it before routing), control
characters, or the path segments ``.`` and ``..`` (clients normalise them away).
"""

from __future__ import annotations

__all__ = ["MAX_NAME_CHARS", "name_problem"]

#: Longer names are refused. Toxiproxy sets no limit; a name goes into every record of
#: its proxy and into URLs, where 16 KB names could be created but never addressed.
MAX_NAME_CHARS = 256


def name_problem(name: str) -> str | None:
    """Why *name* cannot be a proxy or toxic name, or None when it can."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters, not {len(name)}"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it holds a lone surrogate)"
    if "/" in name:
        return "must not contain '/'"
    if name in (".", ".."):
        return f"must not be {name!r}"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "must not contain control characters"
    return None
