"""``faultnet server`` and its client commands.

Commands: ``server``; against a running server (``--api URL``, default
http://127.0.0.1:8474 or $FAULTNET_API): ``proxies``, ``create``, ``delete``,
``enable``, ``disable``, ``toxic add|update|remove|list``, ``fault``, ``connections``,
``events``, ``reset``. ``--json`` prints the API's JSON answer instead of text.

Exit codes: 0 done; 2 a usage or environment error: bad arguments, any API error (bad
input, proxy, toxic or connection not found, already exists, proxy disabled, a listen
address in use), or the API unreachable. Errors are one line on stderr; with ``--json``
the API's error body is printed on stdout too.

The server binds to loopback, and puts proxies on loopback, unless told otherwise by
name: ``--expose`` serves the API beyond loopback (with a warning; ``--token`` then
requires a bearer token), ``--proxies-beyond-loopback`` lets proxies listen anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from faultnet.cliargs import examples
from faultnet.modes import MODES, STREAM_CHOICES, ModeArgumentError, mode, modes_that
from faultnet.server.client import (
    DEFAULT_API,
    ApiClient,
    ApiFailure,
    ApiUnavailable,
    fault_body,
)
from faultnet.udp.modes import UDP_MODES, UDP_ONLY_ARGUMENTS

__all__ = ["register"]

#: The environment variable holding the bearer token (server and client commands).
TOKEN_ENV = "FAULTNET_TOKEN"


#: The UDP proxy's modes that are not TCP modes too, and the argument kinds' types.
_UDP_ONLY = [m for m in UDP_MODES if m not in MODES]
_PYTHON_TYPE: dict[str, Callable[[str], object]] = {
    "choice": str,
    "text": str,
    "whole": int,
    "number": float,
}


def _mode_name(text: str) -> str:
    """A mode as the table spells it (``drop-syn`` and ``drop_syn`` are one mode); a UDP
    proxy's own modes (``latency``, ``size-limit`` ...) too."""
    udp = text.replace("-", "_")
    if udp in UDP_MODES and udp not in MODES:
        return udp
    try:
        return mode(text).name
    except ModeArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _FromEnvironment(str):
    """``$FAULTNET_TOKEN``'s value as ``--token``'s default: argparse checks a string
    default with the option's type, and :func:`_token` names the variable."""


def _token(text: str) -> str:
    """A bearer token: not empty (an empty ``--token`` turned authentication off, and
    so did ``FAULTNET_TOKEN=""``: it was taken as no token at all)."""
    what = f"${TOKEN_ENV} " if isinstance(text, _FromEnvironment) else ""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{what}must not be empty (it would turn the token off)"
            + (f": unset {TOKEN_ENV} or give it a token" if what else "")
        )
    if text != text.strip() or any(c in text for c in "\r\n"):
        raise argparse.ArgumentTypeError(
            f"{what}must not begin or end with spaces or hold a newline"
        )
    return str(text)


def _token_file(path: str) -> str:
    """The token held by the file at *path* (its first line; a final newline is not
    part of it)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(
            f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise argparse.ArgumentTypeError(f"{path} holds no token (its first line is empty)")
    try:
        return _token(lines[0])
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"the token in {path} {exc}") from None


def _add_token_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--token`` and ``--token-file`` (one of them), default ``$FAULTNET_TOKEN``: both
    end in ``args.token``. A token on the command line is visible to every user in
    ``ps``; a file or the environment is not."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--token",
        type=_token,
        # Set but empty is refused, as --token "" is (not taken as "no token").
        default=_FromEnvironment(os.environ[TOKEN_ENV]) if TOKEN_ENV in os.environ else None,
        metavar="TOKEN",
        help=f"{what} (default ${TOKEN_ENV}; on the command line it shows in `ps`: "
        "prefer --token-file or the environment)",
    )
    group.add_argument(
        "--token-file",
        type=_token_file,
        dest="token",
        metavar="FILE",
        help="read the token from the first line of FILE",
    )


def _err(message: str) -> None:
    print(f"faultnet: error: {message}", file=sys.stderr)


def _client_command(func: Callable[[argparse.Namespace, ApiClient], Any]) -> Callable[..., int]:
    """Run *func* against the API; map failures to one line and an exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            client = ApiClient(args.api, token=args.token)
            result = func(args, client)
        except (ApiUnavailable, ModeArgumentError) as exc:
            _err(str(exc))
            return 2
        except ApiFailure as exc:
            _err(f"{exc.message} (HTTP {exc.status})")
            if args.json and exc.body is not None:
                print(json.dumps(exc.body))
            return 2
        if args.json:
            print(json.dumps(result, indent=2) if result is not None else "null")
        elif result is not None:
            print(_human(result))
        return 0

    return run


def _human(result: Any) -> str:
    if isinstance(result, str):
        return result
    return json.dumps(result, indent=2)


def _lines(items: list[Any], line: Callable[[Any], str], empty: str) -> str:
    """One line per item, or *empty* when there are none."""
    return "\n".join(line(x) for x in items) or empty


def _proxy_table(proxies: dict[str, Any]) -> str:
    if not proxies:
        return "no proxies"
    rows = [("NAME", "LISTEN", "UPSTREAM", "ENABLED", "TOXICS")]
    for name, p in sorted(proxies.items()):
        toxics = ", ".join(t["name"] for t in p.get("toxics", [])) or "-"
        rows.append((name, p["listen"], p["upstream"], str(p["enabled"]).lower(), toxics))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    )


def _attributes(pairs: list[str] | None, toxic_type: str | None = None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a toxic's attributes: each value read as JSON (a number, a
    bool), except that an attribute *toxic_type* declares as text stays the text typed
    (``sqlstate=40001`` is the SQLSTATE "40001", not the number)."""
    from faultnet.errors import UsageError
    from faultnet.toxics import TOXICS, TextAttribute

    declared = getattr(TOXICS.get(toxic_type or ""), "ATTRIBUTES", ())
    text = {a.name for a in declared if isinstance(a, TextAttribute)}
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"attribute {pair!r} is not KEY=VALUE")
        if key in text:
            out[key] = value
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # the server names the wrong type
    return out


# -- client commands ---------------------------------------------------------------------


def _proxies(args: argparse.Namespace, c: ApiClient) -> Any:
    proxies = c.request("GET", "/proxies")
    return proxies if args.json else _proxy_table(proxies)


def _create(args: argparse.Namespace, c: ApiClient) -> Any:
    body = {"name": args.name, "upstream": args.upstream, "listen": args.listen}
    if args.disabled:
        body["enabled"] = False
    if args.protocol != "tcp":
        body["protocol"] = args.protocol
    p = c.request("POST", "/proxies", body)
    return p if args.json else f"created {p['name']}: {p['listen']} -> {p['upstream']}"


def _delete(args: argparse.Namespace, c: ApiClient) -> Any:
    c.request("DELETE", f"/proxies/{c.quote(args.name)}")
    return {"deleted": args.name} if args.json else f"deleted {args.name}"


def _enable(enabled: bool) -> Callable[[argparse.Namespace, ApiClient], Any]:
    def run(args: argparse.Namespace, c: ApiClient) -> Any:
        p = c.request("POST", f"/proxies/{c.quote(args.name)}", {"enabled": enabled})
        word = "enabled" if enabled else "disabled"
        return p if args.json else f"{word} {p['name']} ({p['listen']})"

    return run


def _ca(args: argparse.Namespace, c: ApiClient) -> Any:
    answer = c.request("GET", "/ca")
    if args.json:
        return answer
    return answer["path"] if args.path else answer["pem"].rstrip("\n")


def _toxic_add(args: argparse.Namespace, c: ApiClient) -> Any:
    body: dict[str, Any] = {
        "type": args.type,
        "stream": args.stream,
        "toxicity": args.toxicity,
        "attributes": _attributes(args.attribute, args.type),
    }
    if args.name:
        body["name"] = args.name
    t = c.request("POST", f"/proxies/{c.quote(args.proxy)}/toxics", body)
    return t if args.json else f"added {t['name']} ({t['type']}, {t['stream']}) to {args.proxy}"


def _toxic_update(args: argparse.Namespace, c: ApiClient) -> Any:
    path = f"/proxies/{c.quote(args.proxy)}/toxics/{c.quote(args.name)}"
    # Its type says which attributes are text (one GET; the update is a PATCH after it).
    toxic_type = c.request("GET", path)["type"] if args.attribute else None
    body: dict[str, Any] = {"attributes": _attributes(args.attribute, toxic_type)}
    if args.toxicity is not None:
        body["toxicity"] = args.toxicity
    t = c.request("PATCH", path, body)
    return t if args.json else f"updated {t['name']}: {json.dumps(t['attributes'])}"


def _toxic_remove(args: argparse.Namespace, c: ApiClient) -> Any:
    c.request("DELETE", f"/proxies/{c.quote(args.proxy)}/toxics/{c.quote(args.name)}")
    return {"removed": args.name} if args.json else f"removed {args.name} from {args.proxy}"


def _at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least *lo*."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = lo - 1
        if n < lo:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer of at least {lo}")
        return n

    return parse


def _listing(
    what: str, line: Callable[[Any], str], paged: bool = False
) -> Callable[[argparse.Namespace, ApiClient], Any]:
    """A command printing one line per item of ``GET /proxies/{proxy}/{what}`` (with
    *paged*, the page ``--limit`` and ``--after`` ask for)."""

    def run(args: argparse.Namespace, c: ApiClient) -> Any:
        page = {"limit": args.limit, "after": args.after} if paged else {}
        query = "&".join(f"{k}={v}" for k, v in page.items() if v)
        path = f"/proxies/{c.quote(args.proxy)}/{what}" + (f"?{query}" if query else "")
        items = c.request("GET", path)
        return items if args.json else _lines(items, line, f"no {what}")

    return run


_toxic_list = _listing(
    "toxics",
    lambda t: (
        f"{t['name']}  {t['type']}  {t['stream']}  toxicity={t['toxicity']}  "
        f"{json.dumps(t['attributes'])}"
    ),
)
_connections = _listing(
    "connections",
    paged=True,
    line=lambda x: (
        f"#{x['id']}  {x['peer']}  up={x['bytes_upstream']}  "
        f"down={x['bytes_downstream']}  {x['state']}"
        + (
            f"  loss={x['loss']}{' both ways' if x.get('loss_both_ways') else ''}"
            f"  dropped={x['dropped_upstream']}/"
            f"{x['dropped_downstream']}  retransmits={x['retransmits']}"
            + (
                f"  hop: dropped={x['hop_dropped']} retransmits={x['hop_retransmits']}"
                if x.get("on_hop")
                else ""
            )
            if x.get("loss") or x.get("dropped_upstream") or x.get("dropped_downstream")
            else ""
        )
    ),
)


def _fault(args: argparse.Namespace, c: ApiClient) -> Any:
    if args.both_ways:  # said here, before any request: no UDP mode takes it either
        row = MODES.get(args.mode)
        if row is None or not row.takes_both_ways:
            raise ModeArgumentError(
                f"both_ways applies to {_modes_that('takes_both_ways')} only, not {args.mode}"
            )
        row.request(stream=args.stream, both_ways=True)
    body = fault_body(
        args.mode,
        stream=args.stream,
        include_new=args.include_new,
        connections=args.connection,
        percent=args.percent,
        peer=args.peer,
        both_ways=args.both_ways or None,
        **{arg.key: getattr(args, arg.name) for arg in UDP_ONLY_ARGUMENTS},
    )
    r = c.request("POST", f"/proxies/{c.quote(args.proxy)}/faults", body)
    if args.json:
        return r
    acted = f" on {r['connections']} connection(s)" if "connections" in r else ""
    return f"{args.proxy}: {args.mode}{acted}"


def _events(args: argparse.Namespace, c: ApiClient) -> Any:
    path = f"/proxies/{c.quote(args.proxy)}/events" if args.proxy else "/events"
    r = c.request("GET", f"{path}?since={args.since}&limit={args.limit}")
    if args.json:
        return r
    text = _lines(r["events"], json.dumps, "no events")
    if r.get("dropped"):
        # The server keeps every record; say when its file lacks some.
        why = f" ({r['last_error']})" if r.get("last_error") else ""
        text += f"\nevent log {r['path']}: {r['dropped']} records could not be written{why}"
    return text


def _reset(args: argparse.Namespace, c: ApiClient) -> Any:
    c.request("POST", "/reset")
    return {"reset": True} if args.json else "reset: every proxy enabled, every toxic removed"


# -- the server --------------------------------------------------------------------------


def _server(args: argparse.Namespace) -> int:
    import trio

    from faultnet.addresses import is_loopback
    from faultnet.server.registry import ApiError

    if not 0 <= args.port <= 65535:
        _err(f"--port must be 0 to 65535, not {args.port}")
        return 2
    if not is_loopback(args.host):
        if not args.expose:
            _err(
                f"--host {args.host} would serve the control API beyond loopback; "
                "add --expose to mean it (and --token to require a token)"
            )
            return 2
        print(
            f"faultnet: warning: the control API listens on {args.host}, beyond loopback: "
            + (
                "requests must carry the token"
                if args.token
                else "anyone who can reach it can drive every proxy (see --token)"
            ),
            file=sys.stderr,
            flush=True,
        )

    if args.detach:
        return _detach(args)
    if args.event_log:
        # Opened here first, so a path that cannot be a log is reported as that, not as
        # the API's address failing (each proxy opens its own writer on it later).
        from faultnet.eventlog import JsonlWriter

        try:
            JsonlWriter(args.event_log).close()
        except OSError as exc:
            _err(f"cannot open the event log {args.event_log}: {_reason(exc)}")
            return 2
    populate = None
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                populate = json.load(f)
        except (OSError, ValueError) as exc:
            _err(f"cannot read config {args.config}: {exc}")
            return 2
    try:
        trio.run(_serve_forever, args, populate)
    except BaseException as exc:  # trio wraps errors in groups: look inside
        api_error = _find(exc, ApiError)
        if api_error is not None:
            _err(f"config {args.config}: {api_error}")
            return 2
        os_error = _find(exc, OSError)
        if os_error is not None:
            _err(f"cannot serve the API on {args.host}:{args.port}: {_reason(os_error)}")
            return 2
        if _find(exc, KeyboardInterrupt) is not None:
            return 0
        raise
    return 0


#: How long ``--detach`` waits for the server it started to say it listens.
DETACH_TIMEOUT_S = 30.0


def _detach(args: argparse.Namespace) -> int:
    """Start this same command without ``--detach`` as a process of its own (a new
    session: the terminal's hang-up does not reach it), wait until it says it listens,
    print that line and its PID, and return 0, leaving it running; if it exits first,
    pass its error line and exit code on."""
    import selectors
    import subprocess

    argv = [sys.executable, "-m", "faultnet", *[a for a in args.command_line if a != "--detach"]]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(DETACH_TIMEOUT_S)
    line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    if "listening on" in line:
        print(f"{line}; left running as pid {proc.pid} (stop it: kill {proc.pid})", flush=True)
        # The server's own warnings (stderr) went to this pipe; it is not read after this.
        return 0
    try:
        # Its stdout ended (or said something else): it is exiting; wait for it, bounded.
        if not ready:
            raise subprocess.TimeoutExpired(argv, DETACH_TIMEOUT_S)
        proc.wait(timeout=DETACH_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # stop exactly what was started
        proc.kill()
        proc.wait()
        _err(f"the server did not say it listens within {DETACH_TIMEOUT_S:g} s")
        return 2
    err = proc.stderr.read().decode(errors="replace").strip()
    print(err or f"faultnet: error: the server exited {proc.returncode}", file=sys.stderr)
    return proc.returncode or 2


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)


async def _serve_forever(args: argparse.Namespace, populate: Any) -> None:
    import signal

    import trio

    from faultnet.server.api import open_server
    from faultnet.server.metrics import MetricsOptions

    listen_hosts = {"127.0.0.1", "::1", "localhost"} if args.loopback_only else None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_server(
            args.host,
            args.port,
            populate=populate,
            seed=args.seed,
            event_log=args.event_log,
            listen_hosts=listen_hosts,
            beyond_loopback=args.proxies_beyond_loopback,
            token=args.token,
            allow_hosts=args.allow_host,
            metrics=MetricsOptions(proxy=args.proxy_metrics, runtime=args.runtime_metrics),
        ) as server:
            n = len(server.registry.proxies)
            print(
                f"faultnet server listening on {server.url} "
                f"(seed {server.registry.seed}, {n} proxies, "
                f"event log {args.event_log or 'in memory only'})",
                flush=True,
            )
            async for sig in signals:
                server.registry.events.server.write("server_stop", signal=int(sig))
                break


# -- registration ------------------------------------------------------------------------


class _ToxicTypes:
    """Every registered toxic type, as text, looked up when a help text is formatted."""

    def __str__(self) -> str:
        from faultnet.toxics import TOXICS

        return ", ".join(TOXICS)


def _modes_that(flag: str) -> str:
    return "/".join(modes_that(flag))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api",
        default=os.environ.get("FAULTNET_API", DEFAULT_API),
        help=f"the server's URL (default $FAULTNET_API or {DEFAULT_API})",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")
    _add_token_options(common, "bearer token for a server started with a token")

    def client(
        name: str, func: Callable[..., Any], help: str, *example: str, parent: Any = sub
    ) -> Any:
        p = parent.add_parser(
            name, parents=[common], help=help, description=help, epilog=examples(*example)
        )
        p.set_defaults(func=_client_command(func))
        return p

    s = sub.add_parser(
        "server",
        help="run the Toxiproxy-compatible HTTP API (and faultnet's modes)",
        description="Run the Toxiproxy-compatible HTTP API with faultnet's fault modes as "
        "extensions (OpenAPI document at /openapi.json). Stops on SIGINT or SIGTERM.",
        epilog=examples(
            "faultnet server --detach --event-log events.jsonl",
            "faultnet server --host 0.0.0.0 --expose --token-file token.txt",
        ),
    )
    s.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8474, help="API port (default 8474; 0 = any)")
    s.add_argument("--config", help="JSON file: an array of proxies to populate at start")
    s.add_argument(
        "--seed", type=int, help="seed for every random choice (chosen and logged if absent)"
    )
    s.add_argument("--event-log", help="append every event to this JSONL file")
    s.add_argument(
        "--detach",
        action="store_true",
        help="start the server as a process of its own and return once it listens, "
        "printing its address and PID (stop it with kill PID); without it the server "
        "runs in the foreground until SIGINT or SIGTERM",
    )
    s.add_argument(
        "--loopback-only",
        action="store_true",
        help="refuse proxies asked to listen beyond 127.0.0.1, ::1 and localhost (by "
        "default 0.0.0.0 and :: are put on loopback instead, and other hosts refused)",
    )
    s.add_argument(
        "--proxies-beyond-loopback",
        action="store_true",
        help="let proxies listen on the address asked for, 0.0.0.0 included",
    )
    s.add_argument(
        "--expose",
        action="store_true",
        help="allow --host beyond loopback (the API can then drive every proxy from the "
        "network: prints a warning; use --token)",
    )
    _add_token_options(
        s, "require 'Authorization: Bearer TOKEN' on every request but GET /openapi.json"
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name requests may give in their Host header besides the API's address and "
        "loopback's (repeatable; other names are refused with 403, as DNS rebinding)",
    )
    s.add_argument(
        "--proxy-metrics",
        action="store_true",
        help="serve GET /metrics (Prometheus) with each proxy's bytes under Toxiproxy's "
        "names (toxiproxy_proxy_received_bytes_total, ..._sent_bytes_total) and faultnet's "
        "own: connections by state, faults in force, fault and toxic applications",
    )
    s.add_argument(
        "--runtime-metrics",
        action="store_true",
        help="serve GET /metrics with the process's metrics (process_*, python_*, "
        "faultnet_build_info); with neither flag /metrics answers 404, as Toxiproxy's",
    )
    s.set_defaults(func=_server)

    client("proxies", _proxies, "list the proxies", "faultnet proxies --json")
    p = client(
        "create",
        _create,
        "create a proxy",
        "faultnet create redis --listen 127.0.0.1:16379 --upstream 127.0.0.1:6379",
        "faultnet create dns --protocol udp --upstream 127.0.0.1:53",
    )
    p.add_argument("name")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    p.add_argument("--upstream", required=True, help="HOST:PORT of the real server")
    p.add_argument("--disabled", action="store_true", help="create it without listening")
    p.add_argument(
        "--protocol",
        choices=("tcp", "udp"),
        default="tcp",
        help="tcp (default) or udp: a UDP proxy, whose faults are the UDP modes",
    )
    client("delete", _delete, "delete a proxy", "faultnet delete redis").add_argument("name")
    client(
        "enable", _enable(True), "listen again (same address)", "faultnet enable redis"
    ).add_argument("name")
    client(
        "disable",
        _enable(False),
        "close the listener and every connection",
        "faultnet disable redis",
    ).add_argument("name")

    p = client(
        "ca",
        _ca,
        "print the CA certificate tls_terminate's certificates come from",
        'curl --cacert "$(faultnet ca --path)" https://localhost:16443/',
    )
    p.add_argument("--path", action="store_true", help="print its file's path instead")

    t = sub.add_parser(
        "toxic",
        help="add, update, remove or list toxics",
        description="Add, update, remove or list a proxy's toxics (ACTION --help for each).",
        epilog=examples(
            "faultnet toxic add redis --type latency -a latency=100",
            "faultnet toxic list redis",
        ),
    )
    tsub = t.add_subparsers(dest="toxic_command", metavar="ACTION", required=True)
    p = client(
        "add",
        _toxic_add,
        "add a toxic to a proxy",
        "faultnet toxic add redis --type latency --stream downstream -a latency=100 -a jitter=10",
        "faultnet toxic add web --type http_abort -a status=503 -a path='/api/*' -a percent=20",
        parent=tsub,
    )
    p.add_argument("proxy")
    type_arg = p.add_argument("--type", "-t", required=True, help="one of %(toxic_types)s")
    # Read from the toxic registry when the help is shown: importing every toxic (trio,
    # h11, ssl) is a cost no other command should pay.
    type_arg.toxic_types = _ToxicTypes()  # type: ignore[attr-defined,unused-ignore]
    p.add_argument("--name", "-n", help="default <type>_<stream>")
    p.add_argument("--stream", "-s", default="downstream", help="upstream or downstream")
    p.add_argument("--toxicity", type=float, default=1.0, help="0 to 1 (default 1)")
    p.add_argument(
        "--attribute", "-a", action="append", metavar="KEY=VALUE", help="e.g. latency=100"
    )
    p = client(
        "update",
        _toxic_update,
        "update a toxic's attributes or toxicity",
        "faultnet toxic update redis latency_downstream -a latency=250",
        parent=tsub,
    )
    p.add_argument("proxy")
    p.add_argument("name")
    p.add_argument("--toxicity", type=float)
    p.add_argument("--attribute", "-a", action="append", metavar="KEY=VALUE")
    p = client(
        "remove",
        _toxic_remove,
        "remove a toxic",
        "faultnet toxic remove redis latency_downstream",
        parent=tsub,
    )
    p.add_argument("proxy")
    p.add_argument("name")
    client(
        "list",
        _toxic_list,
        "list a proxy's toxics",
        "faultnet toxic list redis --json",
        parent=tsub,
    ).add_argument("proxy")

    p = client(
        "fault",
        _fault,
        "apply a fault mode to a proxy (or undo: thaw, restore)",
        "faultnet fault redis partition",
        "faultnet fault redis thaw",
        "faultnet fault redis loss --percent 5 --both-ways",
        "faultnet fault redis blackhole --peer 127.0.0.1",
    )
    p.description = (
        "To kill the route for old and new connections alike: `partition` (open "
        "connections blackholed, new connects hang; `--peer HOST` for one client; "
        "the same by hand: `blackhole --include-new`, then `drop-syn`). A client that "
        "opens a new "
        "connection per request or on retry (curl, HTTP fetchers, redis-py's retry) is "
        "untouched by a plain freeze: freeze alone is the laptop-changed-networks case "
        "(old sockets dead, new ones fine). Applies a fault mode to a proxy, or undoes "
        "one (thaw, restore)."
    )
    p.add_argument("proxy")
    p.add_argument(
        "mode",
        type=_mode_name,
        choices=[*MODES, *_UDP_ONLY],
        metavar="MODE",
        help=f"one of {', '.join(MODES)} (drop-syn is drop_syn); on a UDP proxy one of "
        f"{', '.join(UDP_MODES)}",
    )
    p.add_argument(
        "--stream",
        default="both",
        choices=STREAM_CHOICES,
        help=f"{_modes_that('takes_stream')} only",
    )
    p.add_argument(
        "--include-new",
        action="store_true",
        help=f"{_modes_that('takes_include_new')}: later connections too",
    )
    p.add_argument(
        "--connection",
        type=int,
        action="append",
        metavar="ID",
        help=f"{_modes_that('per_connection')}: act only on this live connection "
        "(repeatable; ids from `faultnet connections`)",
    )
    p.add_argument(
        "--percent",
        type=float,
        metavar="P",
        help=f"{_modes_that('takes_percent')}: the chance (0-100) each segment or SYN is "
        "dropped (default: the mode's own, see the API)",
    )
    p.add_argument(
        "--both-ways",
        action="store_true",
        help=f"{_modes_that('takes_both_ways')}: lose segments travelling either way, ACKs "
        "included, as a lossy route (an internal hop; --stream both only); default: "
        "only segments arriving at the proxy",
    )
    for arg in UDP_ONLY_ARGUMENTS:
        p.add_argument(
            f"--{arg.key.replace('_', '-')}",
            type=_PYTHON_TYPE[arg.kind],
            help="UDP proxies: "
            + ", ".join(m.name for m in UDP_MODES.values() if m.argument(arg.name)),
        )
    p.add_argument(
        "--peer",
        metavar="HOST[:PORT]",
        help=f"{_modes_that('takes_peer')}: only the client at this address",
    )
    p = client(
        "connections",
        _connections,
        "list a proxy's live connections",
        "faultnet connections redis --json",
        "faultnet connections db --limit 100 --after 400",
    )
    p.add_argument("proxy")
    p.add_argument(
        "--limit",
        type=_at_least(1),
        metavar="N",
        help="at most N connections (default: all); the next page: --after the last id",
    )
    p.add_argument(
        "--after",
        type=_at_least(0),
        default=0,
        metavar="ID",
        help="only connections whose id comes after ID",
    )
    p = client(
        "events",
        _events,
        "print event log records (all, or one proxy's)",
        "faultnet events redis --since 10 --limit 50",
    )
    p.add_argument("proxy", nargs="?")
    p.add_argument("--since", type=int, default=0, help="records numbered after this")
    p.add_argument("--limit", type=int, default=1000)
    client(
        "reset",
        _reset,
        "enable every proxy, remove every toxic, end every mode",
        "faultnet reset --api http://127.0.0.1:8474",
    )
