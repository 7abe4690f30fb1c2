"""The MCP side of the bot: four tools, and a notification per channel message.

Built on the official SDK's low-level ``Server`` (``mcp.server.lowlevel``) rather than
``MCPServer``'s decorators, because the contract's tool and argument names
(``send-channel``, ``expires-in``) are not Python identifiers and the schemas must say
exactly what the contract says.

Notifications outside a request. The SDK hands a handler its ``ServerSession`` only
inside a request. A server middleware keeps the session it sees on
``notifications/initialized`` (or on the first request after ``initialize``, for a
client that skips the notification); a pump task then forwards every channel message as
``notifications/message`` ``{level: "info", logger: "channel", data: {channel, from,
text, time}}`` on the connection's standalone channel, i.e. with no request in flight.
Messages that arrive before the handshake are queued (up to :data:`QUEUE_LIMIT`, then
dropped and counted) and sent once it completes.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import mcp.types as types
import trio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server

from harness.bot._config import BotConfig
from harness.bot._events import EventSink
from harness.bot._irc_link import ChannelMessage, IrcLink

__all__ = ["QUEUE_LIMIT", "BotServer", "parse_expires_in", "serve"]

QUEUE_LIMIT = 1000
_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

_TOOLS = [
    types.Tool(
        name="status",
        description=(
            "The bot's view of its enclave link as JSON: connected, session number, "
            "active IRCv3 caps, reconnect count, timings, defects, counters."
        ),
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    ),
    types.Tool(
        name="send-channel",
        description=(
            "Post text to the channel (one PRIVMSG per line). Success says 'Broadcast to "
            "#chan (N line)' only once the server confirmed it; otherwise the result says "
            "UNCONFIRMED. Returns within the confirmation budget."
        ),
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="spawn-worker",
        description=(
            "Leader only: register a worker bot with EnclaveServ and return its 64-hex "
            "token. expires-in is seconds, or a number with unit s/m/h/d ('30m')."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "nick": {"type": "string", "minLength": 1},
                "expires-in": {"type": ["integer", "number", "string"]},
            },
            "required": ["nick", "expires-in"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="revoke-worker",
        description="Leader only: revoke a worker (its nick stays burned) and drop its link.",
        input_schema={
            "type": "object",
            "properties": {"nick": {"type": "string", "minLength": 1}},
            "required": ["nick"],
            "additionalProperties": False,
        },
    ),
]


def parse_expires_in(value: Any) -> int:
    """Seconds from ``3600``, ``"3600"``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``.

    ValueError unless the result is a whole number of seconds >= 1.
    """
    if isinstance(value, bool):
        raise ValueError("expires-in must be a duration, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    else:
        raise ValueError(f"expires-in {value!r} is not a duration (e.g. 3600, '90s', '30m', '2h')")
    if seconds < 1 or seconds != int(seconds):
        raise ValueError(f"expires-in {value!r} must be a whole number of seconds, at least 1")
    return int(seconds)


def _text(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=error,
    )


class BotServer:
    """Owns the MCP ``Server`` and bridges the IRC link's events to the MCP client."""

    def __init__(self, config: BotConfig) -> None:
        self.config = config
        self._session: ServerSession | None = None
        self._session_ready = trio.Event()
        self._min_level = 0  # index into _LEVELS; the client may raise it (logging/setLevel)
        self._send, self._recv = trio.open_memory_channel[ChannelMessage](QUEUE_LIMIT)
        self.dropped_notifications = 0
        self.link: IrcLink | None = None
        with warnings.catch_warnings():
            # logging/setLevel is deprecated at 2026-07-28, but handshake-era clients use
            # it, and registering it is what declares the logging capability.
            warnings.simplefilter("ignore")
            self.server: Server[Any] = Server(
                "enclave-bot",
                version="1",
                instructions="Reference bot of the faultnet harness: posts to and listens on "
                "one enclave channel.",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_set_logging_level=self._set_level,
            )
        self.server.middleware.append(self._capture_session)

    # ------------------------------------------------------------------ link side

    def on_channel_message(self, msg: ChannelMessage) -> None:
        """Called by the IRC reader; never blocks it (a full queue drops and counts)."""
        try:
            self._send.send_nowait(msg)
        except trio.WouldBlock:
            self.dropped_notifications += 1

    async def pump_notifications(self) -> None:
        """Forward queued channel messages to the MCP client, forever."""
        await self._session_ready.wait()
        session = self._session
        assert session is not None
        async for msg in self._recv:
            if self._min_level > _LEVELS.index("info"):
                continue
            await session.send_notification(
                types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(
                        level="info",
                        logger="channel",
                        data={
                            "channel": msg.channel,
                            "from": msg.sender,
                            "text": msg.text,
                            "time": msg.time,
                        },
                    )
                )
            )

    # ------------------------------------------------------------------ MCP side

    async def _capture_session(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        if self._session is None and (
            ctx.method == "notifications/initialized"
            or (ctx.request_id is not None and ctx.method != "initialize")
        ):
            self._session = ctx.session
            self._session_ready.set()
        return result

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_TOOLS)

    async def _set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        self._min_level = _LEVELS.index(params.level)
        return types.EmptyResult()

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = dict(params.arguments or {})
        link = self.link
        if link is None:  # pragma: no cover - the link is attached before serving
            return _text("the bot is still starting", error=True)
        try:
            if params.name == "status":
                status = link.status()
                status["dropped_notifications"] = self.dropped_notifications
                return _text(json.dumps(status, indent=1, sort_keys=True))
            if params.name == "send-channel":
                text = args.get("text")
                if not isinstance(text, str):
                    raise ValueError("text must be a string")
                result = await link.post(text)
                return _text(result.text, error=not result.claims_delivery)
            if params.name == "spawn-worker":
                nick = self._nick_arg(args)
                seconds = parse_expires_in(args.get("expires-in"))
                reply = await link.service("SPAWN", nick, str(seconds))
                if reply.ok:
                    f = reply.fields
                    return _text(
                        f"Spawned worker {f.get('nick', nick)}: token {f.get('token', '?')} "
                        f"expires {f.get('expires', '?')} (in {seconds} s)"
                    )
                return _text(f"spawn-worker {nick} failed: {reply.text}", error=True)
            if params.name == "revoke-worker":
                nick = self._nick_arg(args)
                reply = await link.service("REVOKE", nick)
                if reply.ok:
                    return _text(f"Revoked worker {nick}")
                return _text(f"revoke-worker {nick} failed: {reply.text}", error=True)
        except ValueError as exc:
            return _text(f"{params.name}: {exc}", error=True)
        return _text(f"unknown tool {params.name!r}", error=True)

    @staticmethod
    def _nick_arg(args: dict[str, Any]) -> str:
        nick = args.get("nick")
        if not isinstance(nick, str) or not nick or any(c.isspace() for c in nick):
            raise ValueError("nick must be one word")
        return nick


async def serve(config: BotConfig) -> None:
    """Run the MCP stdio loop and the IRC link in one nursery until stdin closes."""
    events = EventSink(config.nick, config.event_log)
    bot = BotServer(config)
    link = IrcLink(config, events, bot.on_channel_message)
    bot.link = link
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            nursery.start_soon(bot.pump_notifications)
            async with stdio_server() as (read_stream, write_stream):
                await bot.server.run(
                    read_stream, write_stream, bot.server.create_initialization_options()
                )
            nursery.cancel_scope.cancel()  # the client is gone: so is the bot
    finally:
        events.close()
