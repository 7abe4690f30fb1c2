"""Load a page in headless Chromium and say what a reader's browser would: its console
errors and which of its links do not resolve.

Chromium is driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages, each ended by a NUL byte, read by the browser on fd 3 and written on fd
4), so no websocket library and no TCP port are needed. Every link is fetched by the
page itself (a synchronous XMLHttpRequest, allowed for ``file://`` by
``--allow-file-access-from-files``): a link resolves when Chromium can read what it
names.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PageCheck", "check_page", "find_chromium"]

#: The page's own script: every link's absolute URL and whether reading it worked.
_LINKS_JS = """
JSON.stringify(Array.from(document.querySelectorAll('a[href]')).map(a => {
  const x = new XMLHttpRequest();
  try { x.open('GET', a.href, false); x.send(); return [a.getAttribute('href'), a.href, true]; }
  catch (e) { return [a.getAttribute('href'), a.href, false]; }
}))
"""


def find_chromium() -> str | None:
    """Debian's chromium (or another build on PATH), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageCheck:
    """What loading one page showed."""

    loaded: bool = False
    #: Console errors, uncaught exceptions and error log entries, one line each.
    errors: list[str] = field(default_factory=list)
    #: (href as written, absolute URL, resolved) for every link.
    links: list[tuple[str, str, bool]] = field(default_factory=list)
    #: How many inline <svg> elements the page has.
    svgs: int = 0

    @property
    def broken_links(self) -> list[str]:
        return [href for href, _url, ok in self.links if not ok]


class _Pipe:
    def __init__(self, to_browser: int, from_browser: int) -> None:
        self.w, self.r = to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.r, 65536)
            if not chunk:
                raise EOFError("chromium closed its DevTools pipe")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:  # fmt: skip
        """Send one command; return its result (events met meanwhile are kept)."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev


def _error_lines(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a)) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + str(p.get("exceptionDetails", {}).get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
    return out


def _above_10(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


def check_page(page: Path, chromium: str, profile: Path, timeout: float = 60.0) -> PageCheck:
    """Load *page* (a local file) in headless *chromium* with a fresh *profile*
    directory; return what it showed."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    # The ends the browser gets, moved to fds >= 10 so that putting them on 3 and 4
    # cannot overwrite one with the other (measured: under pytest they were 3 and 4).
    to_r, from_w = _above_10(to_r), _above_10(from_w)
    argv = [
        chromium, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
        "--disable-extensions", "--disable-background-networking", "--remote-debugging-pipe",
        "--allow-file-access-from-files", f"--user-data-dir={profile}", "about:blank",
    ]  # fmt: skip
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
    # bash puts the pipe ends on the fds Chromium reads and writes (3 and 4); dash
    # takes no fd above 9 in a redirection.
    proc = subprocess.Popen(
        ["/bin/bash", "-c", f'exec "$@" 3<&{to_r} 4>&{from_w}', "bash", *argv],
        pass_fds=(to_r, from_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("REPORT_BROWSER_DEBUG") else subprocess.DEVNULL,
    )
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(to_w, from_r)
    result = PageCheck()
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
        session = pipe.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.call(f"{domain}.enable", session=session)
        nav = pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        if nav.get("errorText"):
            result.errors.append(f"navigate: {nav['errorText']}")
            return result
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        result.loaded = True
        got = pipe.call(
            "Runtime.evaluate", {"expression": _LINKS_JS, "returnByValue": True}, session=session
        )
        result.links = [tuple(x) for x in json.loads(got["result"]["value"])]
        svgs = pipe.call(
            "Runtime.evaluate",
            {"expression": "document.querySelectorAll('svg').length", "returnByValue": True},
            session=session,
        )
        result.svgs = int(svgs["result"]["value"])
        result.errors = _error_lines(pipe.events)
        try:
            pipe.call("Browser.close", timeout=10)
        except (EOFError, TimeoutError, RuntimeError):
            pass
    finally:
        os.close(to_w)
        os.close(from_r)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
    return result
