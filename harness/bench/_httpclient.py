"""The HTTP lines' keep-alive client (:mod:`harness.bench._http`), a process of its own,
as ``pingpong.c`` is for the echo lines, with the same interface:

    python -m harness.bench._httpclient h1|h2 HOST PORT COUNT WARMUP [pause]

One connection; WARMUP untimed then COUNT timed requests (``GET /``), one at a time,
each response read whole (h11 for ``h1``; h2 for ``h2``, h2c with prior knowledge, one
stream a request) and its status checked; prints each timed request's time in ns, from
its send to its response's end, one a line. With ``pause``: prints ``ready`` after the
warm-up and waits for a line on stdin, then ``done`` after the timed ones and waits
again (the callgrind line counts the proxy's instructions between the two). Exit 1 on
any failure, with why on stderr.

Python costs ~50 us of CPU a request here: the same in every arm, so it cancels in a
line's added latency (an arm less direct), and it is none of the proxy's instructions.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11

__all__ = ["PATH", "main"]

#: What every request asks (the bench's nginx answers it with a small body).
PATH = "/"
_READ = 65536
_TIMEOUT_S = 300.0  # a proxy under callgrind answers ~50x slower


def _h1(sock: socket.socket, host: str) -> Callable[[], None]:
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(method="GET", target=PATH, headers=[("host", host)])

    def one() -> None:
        sock.sendall(conn.send(request) + conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(_READ))
            elif isinstance(event, h11.Response) and event.status_code != 200:
                raise OSError(f"status {event.status_code}")
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise OSError("the server closed the connection")
        conn.start_next_cycle()

    return one


def _h2(sock: socket.socket, host: str) -> Callable[[], None]:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    headers = [(":method", "GET"), (":path", PATH), (":scheme", "http"), (":authority", host)]

    def one() -> None:
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, headers, end_stream=True)
        sock.sendall(conn.data_to_send())
        ended = False
        while not ended:
            data = sock.recv(_READ)
            if not data:
                raise OSError("the server closed the connection")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers).get(b":status")
                    if status != b"200":
                        raise OSError(f"status {status!r}")
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    ended = True
                elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    raise OSError(f"the server ended the stream: {event}")
            sock.sendall(conn.data_to_send())

    return one


def _wait_line(word: str) -> None:
    print(word, flush=True)
    sys.stdin.readline()


def main(argv: list[str]) -> int:
    try:
        protocol, host, port, count, warmup, *mode = argv
        make = {"h1": _h1, "h2": _h2}[protocol]
        sock = socket.create_connection((host, int(port)), timeout=_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one = make(sock, host)
        for _ in range(int(warmup)):
            one()
        if mode == ["pause"]:
            _wait_line("ready")
        clock = time.perf_counter_ns
        times = []
        for _ in range(int(count)):
            t0 = clock()
            one()
            times.append(clock() - t0)
        if mode == ["pause"]:
            _wait_line("done")
    except (ValueError, KeyError) as exc:
        print(f"usage: h1|h2 HOST PORT COUNT WARMUP [pause] ({exc})", file=sys.stderr)
        return 2
    except (OSError, h11.ProtocolError, h2.exceptions.ProtocolError) as exc:
        print(f"httpclient: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(f"{t}\n" for t in times))
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
