"""``faultnet proxy control-test`` and ``faultnet probe``.

Registering costs nothing: trio, the proxy and the controls are imported by the handler
of the command that runs (every ``faultnet`` call registers every command).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from faultnet.cliargs import examples
from faultnet.errors import UsageError

if TYPE_CHECKING:
    from faultnet.controltest import Step

__all__ = ["register"]


def register(sub: Any) -> None:
    proxy = sub.add_parser(
        "proxy",
        help="the fault proxy's own checks",
        description="Commands about the fault proxy itself.",
        epilog=examples("faultnet proxy control-test --protocol tcp"),
    )
    psub = proxy.add_subparsers(dest="proxy_command", metavar="COMMAND")
    ct = psub.add_parser(
        "control-test",
        help="prove every control passes on its mode and goes red when the mode is broken",
        description=(
            "Start a throwaway echo upstream and proxy on 127.0.0.1; for every fault mode "
            "run its control on the real mode (must pass) and on deliberate breakages "
            "(must go red). Exit 0 only if all of that held; 1 otherwise."
        ),
        epilog=examples(
            "faultnet proxy control-test",
            "faultnet proxy control-test --protocol udp --json",
        ),
    )
    ct.add_argument("--json", action="store_true", help="print one JSON document")
    ct.add_argument(
        "--protocol",
        choices=("tcp", "udp", "both"),
        default="both",
        help="the TCP proxy's modes, the UDP proxy's (named udp:MODE), or both (default)",
    )
    ct.set_defaults(func=_control_test)
    proxy.set_defaults(func=lambda args: _help(proxy))

    pr = sub.add_parser(
        "probe",
        help="classify one fresh connect: connected, refused, hung or reset",
        description="Connect once to HOST:PORT and print connected, refused, hung or "
        "reset; with --udp send one datagram and print answered, refused or silent. "
        "Exit 0 after any classification; 2 for a bad address.",
        epilog=examples(
            "faultnet probe 127.0.0.1:16379 --timeout 2",
            "faultnet probe --udp 127.0.0.1:5353 --json",
        ),
    )
    pr.add_argument(
        "--udp", action="store_true", help="probe a UDP service with one datagram instead"
    )
    pr.add_argument("address", metavar="HOST:PORT")
    pr.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds before a connect counts as hung, or a datagram as unanswered (default 1)",
    )
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.set_defaults(func=_probe)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _control_test(args: argparse.Namespace) -> int:
    import trio

    from faultnet.controltest import run_control_test
    from faultnet.interrupts import cancel_on_signals
    from faultnet.udp.controltest import run_udp_control_test

    def progress(step: Step) -> None:
        if not args.json:
            mark = "ok " if step.ok else "BAD"
            print(
                f"{mark} {step.mode:<14} {step.arm:<62} {step.control:<28} "
                f"want {step.expected:<4} got {step.outcome:<4} "
                f"[{step.before} | {step.during} | {step.after}] {step.elapsed_ms:7.1f} ms",
                flush=True,
            )
            if not step.ok:
                print(f"      {step.detail}", flush=True)

    if not args.json:
        print(
            "faultnet control test: each control on its real mode (want pass) and on "
            "each breakage (want red)",
            flush=True,
        )
    steps: list[Step] = []

    async def run() -> int:
        # TCP's and UDP's run at once (each on proxies of its own); steps listed TCP first.
        tcp: list[Step] = []
        udp: list[Step] = []

        async def run_tcp() -> None:
            tcp.extend(await run_control_test(progress))

        async def run_udp() -> None:
            udp.extend(await run_udp_control_test(progress))

        async with trio.open_nursery() as nursery:
            if args.protocol in ("tcp", "both"):
                nursery.start_soon(run_tcp)
            if args.protocol in ("udp", "both"):
                nursery.start_soon(run_udp)
        steps.extend(tcp + udp)
        return 0

    # Ctrl-C cancels the test: its proxies and listeners close, exit 130, one line.
    interrupted = trio.run(cancel_on_signals, run)
    if interrupted:
        return interrupted
    bad = [s for s in steps if not s.ok]
    if args.json:
        print(json.dumps({"ok": not bad, "steps": [s.to_json() for s in steps]}, indent=2))
    else:
        reds = sum(1 for s in steps if s.expected == "red" and s.ok)
        passes = sum(1 for s in steps if s.expected == "pass" and s.ok)
        print(
            f"\n{passes} controls passed on their real mode, {reds} breakages went red, "
            f"{len(bad)} step(s) wrong: {'PASS' if not bad else 'FAIL'}"
        )
    return 0 if not bad else 1


def _probe(args: argparse.Namespace) -> int:
    import trio

    from faultnet.addresses import parse_address
    from faultnet.probe import ProbeResult, probe
    from faultnet.udp.probe import UdpProbeResult, udp_probe

    try:
        address = parse_address(args.address, port_zero=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout}")
    result: ProbeResult | UdpProbeResult
    try:
        if args.udp:
            result = trio.run(udp_probe, address, args.timeout)
        else:
            result = trio.run(probe, address, args.timeout)
    except OSError as exc:
        raise UsageError(f"cannot probe {args.address}: {exc.strerror or exc}") from None
    print(json.dumps(result.to_json()) if args.json else str(result))
    return 0
