"""Fixtures for the project's own tests: a PostgreSQL server and throwaway databases on it.

The server is an embedded cluster per test session (per xdist worker), because migrating
creates cluster-wide roles (keel_owner, keel_app, ...) that a shared server would keep.
Set $AGENTKEEL_TEST_ADMIN_DSN to a superuser DSN to test against another server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

import citus_cluster
from agentkeel.embedded import EmbeddedPostgres
from agentkeel.migrate import migrate_up
from agentkeel.sql_files import sql_root
from pgbouncer import PgBouncer, PgBouncerNotFound

pytest_plugins = ["progress_lines"]

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "agentkeel"
AGENTKEEL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "agentkeel.cli"]


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    dsn = os.environ.get("AGENTKEEL_TEST_ADMIN_DSN")
    if dsn:
        yield dsn
        return
    with EmbeddedPostgres() as pg:
        yield pg.dsn


@pytest.fixture
def make_db(admin_dsn: str) -> Iterator[Callable[[], str]]:
    """Create empty databases (dropped after the test); returns their DSNs."""
    made: list[str] = []

    def _make() -> str:
        name = f"agentkeel_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
        made.append(name)
        return conninfo.make_conninfo(admin_dsn, dbname=name)

    yield _make
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(
                sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
            )


@pytest.fixture
def db(make_db: Callable[[], str]) -> str:
    """An empty database."""
    return make_db()


@pytest.fixture
def migrated_db(db: str) -> str:
    """A database with the whole agentkeel schema applied."""
    with psycopg.connect(db, autocommit=True) as conn:
        migrate_up(conn, sql_root())
    return db


@pytest.fixture(scope="session")
def citus_admin_dsn() -> str:
    """The Citus cluster's coordinator, as a superuser ($AGENTKEEL_CITUS_DSN); skips
    when it is unset (tests/citus_cluster.py)."""
    return citus_cluster.admin_dsn()


@pytest.fixture
def citus_db(citus_admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database on every node of the Citus cluster (Citus installed, the
    nodes added), dropped afterwards: the coordinator's superuser DSN."""
    with citus_cluster.fresh_database(citus_admin_dsn) as dsn:
        yield dsn


@pytest.fixture
def citus_keel(citus_db: str) -> str:
    """A fresh Citus database with agentkeel migrated and distributed (`agentkeel migrate
    up`, then `agentkeel distribute --apply`)."""
    citus_cluster.migrate_and_distribute(citus_db)
    return citus_db


@pytest.fixture(scope="session")
def _pgbouncers() -> Iterator[dict[tuple[str, int, bool], PgBouncer]]:
    started: dict[tuple[str, int, bool], PgBouncer] = {}
    yield started
    for bouncer in started.values():
        bouncer.cleanup()


@pytest.fixture
def through_pgbouncer(
    _pgbouncers: dict[tuple[str, int, bool], PgBouncer],
) -> Callable[..., str]:
    """through_pgbouncer(dsn, round_robin=False): the same database and user through
    PgBouncer in transaction mode (tests/pgbouncer.py). round_robin=True spreads one
    client's transactions over the pool's backends. One pgbouncer per server and setting,
    started on first use and kept for the test session. Skips when pgbouncer is not
    installed."""

    def _through(dsn: str, *, round_robin: bool = False) -> str:
        params = conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1")
        port = int(str(params.get("port") or 5432))
        bouncer = _pgbouncers.get((host, port, round_robin))
        if bouncer is None:
            try:
                bouncer = PgBouncer(host, port, round_robin=round_robin).start()
            except PgBouncerNotFound as err:
                pytest.skip(str(err))
            _pgbouncers[(host, port, round_robin)] = bouncer
        return bouncer.dsn_for(dsn)

    return _through


@pytest.fixture
def sql_tree(tmp_path: Path) -> Path:
    """A private copy of schema/, functions/ and policies/ that a test may edit."""
    root = tmp_path / "sql"
    for folder in ("schema", "functions", "policies"):
        src = REPO / folder
        if src.is_dir():
            shutil.copytree(src, root / folder)
        else:
            (root / folder).mkdir(parents=True)
    return root


def run_agentkeel(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in a subprocess."""
    if cwd is None:  # not the checkout: failure artifacts of suite runs must not land in it
        cwd = Path(tempfile.gettempdir()) / "agentkeel-tests"
        cwd.mkdir(exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k != "AGENTKEEL_DSN"}
    full_env.update(env or {})
    return subprocess.run(
        [*AGENTKEEL, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def temporary_login(dsn: str, *groups: str) -> Iterator[str]:
    """A login role of its own (a unique name: roles are cluster-wide) in the given group
    roles; yields its DSN and drops it afterwards."""
    name = f"akt_{groups[0].removeprefix('keel_')}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("create role {} login in role {}").format(
                sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, groups))
            )
        )
    try:
        yield conninfo.make_conninfo(dsn, user=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))
