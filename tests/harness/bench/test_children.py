"""The bench's own servers (socat, redis-server) on a port of their own: real processes,
real ports."""

from __future__ import annotations

import shutil
import socket

import pytest

import harness.bench._children as children
from faultnet.errors import EnvironmentProblem
from harness.bench._children import Socat, start_listening
from harness.env import tcp_listen_inodes
from tests.conftest import require_program


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_a_port_taken_before_socat_binds_it_is_given_up_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race (a port found free, then taken before socat binds it) cannot be timed
    # from here; its outcome can: the first port handed out is one this test holds.
    socat_path = require_program(shutil.which("socat"), "socat")
    taken, upstream = _listener(), _listener()
    ports = iter([taken.getsockname()[1]])
    real = children._free_port
    monkeypatch.setattr(children, "_free_port", lambda: next(ports, None) or real())
    socat = Socat(socat_path, upstream.getsockname()[1])
    try:
        assert socat.port != taken.getsockname()[1]
        assert children._holds(socat.child.pid, tcp_listen_inodes(socat.port))
        with socket.create_connection(("127.0.0.1", socat.port), timeout=5):
            conn, _ = upstream.accept()  # socat reached the upstream: it is ours
            conn.close()
    finally:
        socat.child.stop()
        taken.close()
        upstream.close()


def test_a_server_that_never_listens_is_an_environment_problem() -> None:
    # A real process that exits at once, every try: three ports, then a clear error.
    with pytest.raises(EnvironmentProblem, match="did not listen on a free port in 3 tries"):
        start_listening(lambda port: ["/bin/false", str(port)], "a server")
