"""The planes' pipe pool (faultnet.planes._pipes), on its own."""

from __future__ import annotations

import errno
import fcntl
import os

from faultnet.planes._pipes import SPLICE_CHUNK, PipePool

_F_GETPIPE_SZ = 1032


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def test_pipe_pool_lends_non_blocking_pipes_of_the_asked_size_and_reuses_them() -> None:
    pool = PipePool(keep=1)
    r, w = pool.take()
    try:
        assert os.get_blocking(r) is False and os.get_blocking(w) is False
        with open("/proc/sys/fs/pipe-max-size") as f:
            if int(f.read()) >= SPLICE_CHUNK:
                assert fcntl.fcntl(w, _F_GETPIPE_SZ) == SPLICE_CHUNK
        pool.give((r, w))
        assert pool.take() == (r, w)  # an idle pipe is lent again, not remade
    finally:
        pool.give((r, w))
        pool.close()
    assert _closed(r) and _closed(w)


def test_pipe_pool_keeps_at_most_keep_and_closes_the_rest() -> None:
    pool = PipePool(keep=2)
    pipes = [pool.take() for _ in range(4)]
    for pipe in pipes:
        pool.give(pipe)
    assert [_closed(fd) for pipe in pipes for fd in pipe] == [False] * 4 + [True] * 4
    pool.close()
    assert all(_closed(fd) for pipe in pipes for fd in pipe)


def test_pipe_pool_discard_closes_a_pipe_that_may_hold_bytes() -> None:
    pool = PipePool()
    r, w = pool.take()
    os.write(w, b"held")
    pool.discard((r, w))
    assert _closed(r) and _closed(w)
    pool.close()
