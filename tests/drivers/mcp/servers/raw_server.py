"""A scripted MCP stdio peer with no SDK: it starts in ~50 ms and can misbehave on cue.

The official SDK frames perfectly; this peer produces the framing and protocol edges a
driver must survive. Options shape the whole session:

  --version V       answer initialize with protocolVersion V (default: echo the offer)
  --crlf            end every line with CRLF
  --trickle         write every message in three pieces, 20 ms apart (partial lines)
  --silent          never answer anything (a dead server that keeps its pipes open)
  --ignore-eof      on stdin EOF, stay alive (until a signal)
  --ignore-term     ignore SIGTERM

Tools (tools/call name): echo {text}; burst (a notification, a server ping and the
answer, all in ONE write); batch (notification + answer as one JSON array); collide (a
server ping whose id equals the client's request id, answered only after our pong);
junk (bad lines on stdout, then the answer); rpcerror (a JSON-RPC error); big {size} (the answer as an oversize line,
and nothing else); noanswer (never answers; logs "cancelled ID" on stderr when told);
exit {code} (dies mid-call after a stderr line); orphan (leaves a grandchild holding our
stdout, logs "orphan PID" on stderr, dies mid-call); flood {count} (that many
notifications, 500 per write, then the answer).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

OUT = 1


def log(text: str) -> None:
    os.write(2, (text + "\n").encode())


class Peer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.eol = b"\r\n" if args.crlf else b"\n"
        self.waiting_pong: dict[object, object] = {}  # our ping id -> client request id

    def send(self, *messages: object, raw: bytes | None = None) -> None:
        data = raw if raw is not None else b"".join(self.encode(m) for m in messages)
        if self.args.trickle and len(data) >= 3:
            third = len(data) // 3
            for piece in (data[:third], data[third : 2 * third], data[2 * third :]):
                os.write(OUT, piece)
                time.sleep(0.02)  # the trickle IS the scenario: bytes arrive in pieces
        else:
            os.write(OUT, data)

    def encode(self, message: object) -> bytes:
        return json.dumps(message).encode() + self.eol

    @staticmethod
    def result(rid: object, text: str, is_error: bool = False) -> dict:
        return {
            "jsonrpc": "2.0",
            "id": rid,
            "result": {"content": [{"type": "text", "text": text}], "isError": is_error},
        }

    def handle(self, msg: dict) -> None:
        method, rid = msg.get("method"), msg.get("id")
        if method is None:  # a response: the pong to one of our pings
            if rid in self.waiting_pong:
                client_id = self.waiting_pong.pop(rid)
                ok = msg.get("result") == {}
                self.send(self.result(client_id, f"pong for server id {rid} ok={ok}"))
            return
        if method == "notifications/cancelled":
            log(f"cancelled {msg['params']['requestId']}")
            return
        if rid is None:
            return
        if self.args.silent:
            return
        if method == "initialize":
            offered = msg["params"]["protocolVersion"]
            result = {
                "protocolVersion": self.args.version or offered,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw-peer", "version": "0"},
            }
            self.send({"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "ping":
            self.send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "tools/list":
            self.send({"jsonrpc": "2.0", "id": rid, "result": {"tools": []}})
        elif method == "tools/call":
            self.call(rid, msg["params"]["name"], msg["params"].get("arguments") or {})
        else:
            err = {"code": -32601, "message": "Method not found"}
            self.send({"jsonrpc": "2.0", "id": rid, "error": err})

    def call(self, rid: object, name: str, args: dict) -> None:
        note = {"jsonrpc": "2.0", "method": "notifications/message"}
        if name == "echo":
            self.send(self.result(rid, args.get("text", "")))
        elif name == "burst":
            self.send(
                {**note, "params": {"level": "info", "data": "burst note"}},
                {"jsonrpc": "2.0", "id": "srv-1", "method": "ping"},
                self.result(rid, "burst answer"),
            )
        elif name == "batch":
            batch = [{**note, "params": {"level": "info", "data": "batch note"}}]
            batch.append(self.result(rid, "batch answer"))
            self.send(raw=json.dumps(batch).encode() + self.eol)
        elif name == "collide":
            self.waiting_pong[rid] = rid
            self.send({"jsonrpc": "2.0", "id": rid, "method": "ping"})
        elif name == "junk":
            self.send(raw=b"not json at all" + self.eol)
            self.send(raw=b"\xff\xfe broken utf-8" + self.eol)
            self.send(raw=b'{"hello": "no jsonrpc"}' + self.eol)
            self.send(raw=b'{"jsonrpc": "2.0", "id": 999999, "result": {}}' + self.eol)
            self.send(self.result(rid, "after junk"))
        elif name == "big":
            text = "x" * int(args.get("size", 1 << 20))
            self.send(self.result(rid, text))
        elif name == "rpcerror":
            err = {"code": -32602, "message": "Invalid params: scripted"}
            self.send({"jsonrpc": "2.0", "id": rid, "error": err})
        elif name == "noanswer":
            log(f"noanswer {rid}")
        elif name == "exit":
            log(f"exiting with {args.get('code', 3)} during call {rid}")
            os._exit(int(args.get("code", 3)))
        elif name == "orphan":
            # A grandchild that inherits our stdout and outlives us: after we exit, the
            # driver never sees stdout close.
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            log(f"orphan {child.pid}")
            os._exit(3)
        elif name == "flood":
            count = int(args.get("count", 1000))
            chunk = self.encode({**note, "params": {"level": "info", "data": "flood"}}) * 500
            for _ in range(count // 500):
                self.send(raw=chunk)
            self.send(self.result(rid, f"flooded {count // 500 * 500}"))
        else:
            self.send(self.result(rid, f"Unknown tool: {name}", is_error=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version")
    parser.add_argument("--crlf", action="store_true")
    parser.add_argument("--trickle", action="store_true")
    parser.add_argument("--silent", action="store_true")
    parser.add_argument("--ignore-eof", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    peer = Peer(args)
    log("ready")
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            log(f"bad line {line[:40]!r}")
            continue
        peer.handle(msg)
    log("stdin closed")
    if args.ignore_eof:
        log("eof ignored")
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
