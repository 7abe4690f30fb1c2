"""Protocol-aware faults: one module per protocol, below the toxics that use it.

A protocol module holds what it takes to fault a protocol's messages rather than its
bytes: the parsing (a well-kept sans-I/O parser, never one written here), the pairing of
requests with their answers, and a per-connection session that moves the original bytes
on, untouched unless a fault says otherwise. A session is pure (mitmproxy's layers,
h11): events in (bytes, an end, a timer, each with its time), commands out (forward,
inject, hold, resume, end of stream, close, reset); its states are one table. It does
no I/O and imports nothing of :mod:`faultnet.toxics`; a both-stream toxic's stages carry
its commands out (:mod:`faultnet.toxics.http`).

* :mod:`faultnet.protocols.http` -- HTTP/1.1 (h11): abort, delay, slow body, truncate,
  reset, hold, header changes, each per request.
* :mod:`faultnet.protocols.http2` -- HTTP/2 and gRPC (h2's hyperframe and hpack): the
  same faults per stream, RST_STREAM, GOAWAY and gRPC statuses, each request's bytes
  untouched unless faulted; :mod:`faultnet.protocols.http_front` reads a connection's
  first bytes and runs the HTTP/1.1 or the HTTP/2 session.
* :mod:`faultnet.protocols.tls` -- TLS: termination with a throwaway CA (trustme),
  re-origination towards the upstream, negotiated as one hop (SNI and ALPN passed
  upstream, a leaf per name asked, a 502 for a failed upstream), and the record
  framing the handshake faults read; both ends pure sessions over ssl's memory BIOs.
* :mod:`faultnet.protocols.dns` -- DNS (dnspython): which queries a rule faults and
  what is done to them, for the UDP proxy's ``dns`` row and the ``dns`` toxic;
  :mod:`faultnet.protocols.dns_tcp` frames it over TCP (RFC 1035 4.2.2).
* :mod:`faultnet.protocols.resp` -- Redis's RESP2 and RESP3 (a bounded scanner of our
  own: no library parses RESP for a proxy): commands paired with replies in order, an
  error, delay, hold or cut per command, for the ``redis`` toxic.
* :mod:`faultnet.protocols.postgres` -- PostgreSQL's v3 wire protocol (framed here,
  bounded: no library parses it): errors with a SQLSTATE, delay, hold, a close
  mid-result, per query, at COMMIT or at startup, for the ``postgres`` toxic.

Adding a protocol (Redis's RESP, PostgreSQL's wire protocol...) touches:

1. ``faultnet/protocols/resp.py``: a pure session (``receive(stream, data, now)``,
   ``receive_eof``, ``timer``, each returning commands) which parses each stream with
   the protocol's parser, pairs each request with its reply (in order, as HTTP/1.1 and RESP
   do, or by tag as PostgreSQL's extended protocol does), forwards the bytes as they came
   and asks a *decide* callback what to do with each request (a plan: data saying what
   to do to the request and its reply, as :class:`faultnet.protocols.http.Plan`);
2. ``faultnet/toxics/resp.py``: toxic types with ``both_streams = True`` whose attributes
   say which requests to match (command, key glob, percent, count) and what to do, each
   building the session on its connection's first bytes (see
   :mod:`faultnet.toxics.http` for the pattern), registered with ``@register``;
3. tests against a real server with a real client, as ``tests/faultnet/toxics/test_http.py``.

Nothing else: the server, the CLI, the OpenAPI document and the chaos catalogue find
the toxic types in :data:`faultnet.toxics.TOXICS`.
"""
