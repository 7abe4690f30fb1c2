"""Reading a run directory safely: only regular files inside it, and JSON in its
writer's shape.

* :class:`EvidenceDir` reads only regular files reached from the run directory through
  real directories (``lstat`` on every component): a symbolic link (out of the
  directory or not), a FIFO or a socket is never opened, and what was passed over is
  said (:attr:`EvidenceDir.skipped`).
* :func:`read_records` reads a JSONL log; a truncated tail (a killed writer) or
  corruption is a note, not an error.
* :func:`read_json` reads a file that is one JSON object (``result.json``,
  ``verdict.json``): not JSON at all is a note (what a killed writer leaves); JSON of
  the wrong shape, held to a table of its fields' shapes (:data:`RESULT_SHAPE`,
  :data:`VERDICT_SHAPE`), is :class:`MalformedEvidence`, one line naming the field.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from faultnet.eventlog import CorruptLogError, read_jsonl

__all__ = [
    "RESULT_SHAPE",
    "VERDICT_SHAPE",
    "EvidenceDir",
    "MalformedEvidence",
    "Shape",
    "check_shape",
    "is_run_dir",
    "read_json",
    "read_records",
    "why_not_read",
]


class MalformedEvidence(Exception):
    """A JSON file read as a whole (``result.json``, ``verdict.json``, ``pair.json``) is
    not in the shape its writer gives it; the message is one line: the file, the field,
    what it must be."""


# --------------------------------------------------------------------------- shapes

#: A field's shape: what it must be (said in the error) and the test of a value.
Shape = tuple[str, Callable[[Any], bool]]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _dict(v: Any) -> bool:
    return isinstance(v, dict)


def _named(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("name"), str)


#: The fields of result.json the report reads, as ``Result.to_json`` writes them
#: (harness/experiment/_result.py); a field may be absent, never of another shape.
RESULT_SHAPE: dict[str, Shape] = {
    "experiment": ("a string", _str),
    "arm": ("a string", _str),
    "seed": ("an integer or null", _optional(lambda v: isinstance(v, int) and _number(v))),
    "time_scale": ("a number or null", _optional(_number)),
    "duration_s": ("a number or null", _optional(_number)),
    "bot_argv": ("a list of strings", _list_of(_str)),
    "checks": ("a list of objects, each with a string name", _list_of(_named)),
    "headline": ("an object", _dict),
    "controls": ("a list of objects", _list_of(_dict)),
    "error": ("a string or null", _optional(_str)),
    "passed": ("true or false", lambda v: isinstance(v, bool)),
    "details": (
        "an object whose posts, if any, is a list",
        lambda v: isinstance(v, dict) and isinstance(v.get("posts", []), list),
    ),
}

#: verdict.json, as the fleet's verifier writes it (harness/fleet/verify.py).
VERDICT_SHAPE: dict[str, Shape] = {
    "ok": ("true or false", lambda v: isinstance(v, bool)),
    "checks": ("a list of objects", _list_of(_dict)),
}


def check_shape(doc: Any, shape: dict[str, Shape], where: str) -> dict[str, Any]:
    """*doc* if it is an object whose fields in *shape* (each optional) have their
    shape; else :class:`MalformedEvidence` saying, in one line, which field of *where*."""
    if not isinstance(doc, dict):
        raise MalformedEvidence(
            f"{where}: malformed: a JSON object expected, not {type(doc).__name__}"
        )
    for key, (what, test) in shape.items():
        if key in doc and not test(doc[key]):
            got = json.dumps(doc[key])
            got = got if len(got) <= 40 else got[:37] + "..."
            raise MalformedEvidence(f"{where}: malformed: {key} must be {what}, not {got}")
    return doc


# --------------------------------------------------------------------------- the directory


def why_not_read(root: Path, rel: str, *, directory: bool = False) -> str | None:
    """None if ``root/rel`` is a regular file (a directory, with *directory*) reached
    from *root* through real directories only, no component a symbolic link; else why
    it is not read: "absent", "a symbolic link", "not a regular file", "not a directory".
    """
    cur = root
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            mode = os.lstat(cur).st_mode
        except FileNotFoundError:
            return "absent"
        except OSError as exc:
            return f"unreadable ({exc.strerror})"
        if stat.S_ISLNK(mode):
            return "a symbolic link"
        if i == len(parts) - 1 and not directory:
            return None if stat.S_ISREG(mode) else "not a regular file"
        if not stat.S_ISDIR(mode):
            return "not a directory"
    return None


class EvidenceDir:
    """A run directory as the loader may read it: only regular files inside it, reached
    through real directories. Whatever else is met where evidence is looked for (a
    symbolic link, a FIFO, a socket) is not opened; :attr:`skipped` says what, once each.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: Relative path -> why it was not read, in the order met.
        self.skipped: dict[str, str] = {}

    def _ok(self, rel: str) -> bool:
        why = why_not_read(self.root, rel)
        if why is not None and why != "absent":
            self.skipped.setdefault(rel, why)
        return why is None

    def file(self, rel: str) -> Path | None:
        """``root/rel`` if it may be read (None if absent or skipped)."""
        return self.root / rel if self._ok(rel) else None

    def exists(self, rel: str) -> bool:
        """Is there anything at all at ``root/rel`` (a link, even a broken one, counts)?"""
        return os.path.lexists(self.root / rel)

    def glob(self, *patterns: str) -> list[Path]:
        """The readable files matching any of *patterns* (relative, no ``**``), sorted."""
        hits = {f for pat in patterns for f in self.root.glob(pat)}
        rels = sorted(f.relative_to(self.root).as_posix() for f in hits)
        return [self.root / r for r in rels if self._ok(r)]

    def subdirs(self, rel: str) -> list[Path]:
        """The real directories directly inside ``root/rel`` (a linked one is skipped)."""
        why = why_not_read(self.root, rel, directory=True)
        if why is not None:
            if why != "absent":
                self.skipped.setdefault(rel, why)
            return []
        out = []
        for d in sorted((self.root / rel).iterdir()):
            r = d.relative_to(self.root).as_posix()
            why = why_not_read(self.root, r, directory=True)
            if why == "a symbolic link":
                self.skipped.setdefault(r, why)
            elif why is None:
                out.append(d)
        return out

    def text(self, rel: str) -> str | None:
        f = self.file(rel)
        return None if f is None else f.read_text(errors="replace")

    def listing(self, leave_out: Iterable[str] = ()) -> list[str]:
        """Every regular file under the directory (relative paths, sorted), walked
        without following links; what is not a regular file is skipped and said."""
        leave = set(leave_out)
        out = []
        for top, dirs, files in os.walk(self.root, followlinks=False):
            here = Path(top).relative_to(self.root)
            for d in list(dirs):
                if os.path.islink(os.path.join(top, d)):
                    self.skipped.setdefault((here / d).as_posix(), "a symbolic link")
                    dirs.remove(d)
            for f in files:
                rel = (here / f).as_posix()
                if rel not in leave and self._ok(rel):
                    out.append(rel)
        return sorted(out)

    def skipped_lines(self) -> list[str]:
        """One line per skipped path: ``NAME: why, not read``."""
        return [f"{rel}: {why}, not read" for rel, why in self.skipped.items()]


def is_run_dir(path: Path) -> bool:
    """Does *path* hold one run's evidence (a result, or at least the harness's log) as
    regular files? (Whether *path* itself may be a link is its caller's to say.)"""
    path = Path(path)
    if not path.is_dir():
        return False
    return any(why_not_read(path, f) is None for f in ("result.json", "events.jsonl"))


# --------------------------------------------------------------------------- reading


def read_records(path: Path | None, notes: list[str]) -> list[dict[str, Any]]:
    """The records of one JSONL file (None: absent or skipped); a truncated tail or
    corruption becomes a note."""
    if path is None:
        return []
    try:
        read = read_jsonl(path)
    except CorruptLogError as exc:
        notes.append(f"{path.name}: corrupt, not drawn ({exc})")
        return []
    except OSError as exc:
        notes.append(f"{path.name}: unreadable ({exc})")
        return []
    if read.truncated_tail is not None:
        notes.append(f"{path.name}: its last line was truncated (the writer was killed)")
    return [r for r in read.records if isinstance(r, dict)]


def read_json(
    path: Path | None, notes: list[str], shape: dict[str, Shape]
) -> dict[str, Any] | None:
    """The object in *path* (None: absent or skipped); None (and a note) if it is not
    JSON at all (a killed writer's truncation); :class:`MalformedEvidence` if it is JSON
    of the wrong shape."""
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name}: unreadable ({exc})")
        return None
    return check_shape(doc, shape, str(path))
