"""Which database a command works on: --dsn / $AGENTKEEL_DSN, else a throwaway cluster."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from agentkeel.embedded import EmbeddedPostgres
from agentkeel.migrate import migrate_up
from agentkeel.preflight import connect
from agentkeel.sql_files import sql_root


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def cleanup_on_sigterm() -> Iterator[None]:
    """Handle SIGTERM (a supervisor's stop, `kill`) as Ctrl-C: KeyboardInterrupt, so
    `finally` blocks (cluster removal) run, pytest tears down, and the CLI exits 130."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def embedded_cluster(*, migrated: bool = True, durable: bool = False) -> Iterator[EmbeddedPostgres]:
    """A throwaway cluster with the agentkeel schema applied; removed on exit, Ctrl-C or
    SIGTERM. durable: fsync on (EmbeddedPostgres)."""
    with cleanup_on_sigterm(), EmbeddedPostgres(durable=durable) as pg:
        if migrated:
            with connect(pg.dsn) as conn:
                migrate_up(conn, sql_root())
        yield pg


@contextmanager
def embedded_database(*, migrated: bool = True, durable: bool = False) -> Iterator[str]:
    """The DSN of embedded_cluster()."""
    with embedded_cluster(migrated=migrated, durable=durable) as pg:
        yield pg.dsn


@contextmanager
def database(dsn: str | None, *, migrated: bool = True, durable: bool = False) -> Iterator[str]:
    """The given DSN as is, or an embedded, migrated, throwaway database (durable: fsync
    on)."""
    if dsn:
        yield dsn
        return
    with embedded_database(migrated=migrated, durable=durable) as embedded_dsn:
        yield embedded_dsn
