"""Fixtures: the database under test, connections with timeouts, fresh tenants, a workflow."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest

from agentkeel.client import Keel, Task
from agentkeel.migrate import migrate_up
from agentkeel.sql_files import sql_root
from agentkeel.target import embedded_database

TENANT_PREFIX = "agentkeel-conformance-"
WORKFLOW_PREFIX = "akc-"

# Every test connection carries these, so a hung test fails instead of hanging CI.
CONNECTION_OPTIONS = (
    "-c statement_timeout=30000 -c lock_timeout=10000 -c idle_in_transaction_session_timeout=60000"
)

# The workflow the suite drives: every test that needs edges uses this one.
EDGES = (
    ("queued", "running"),
    ("queued", "cancelled"),
    ("running", "waiting"),
    ("waiting", "running"),
    ("running", "done"),
    ("running", "failed"),
)

Connect = Callable[..., psycopg.Connection]


@dataclass(frozen=True)
class Workflow:
    name: str
    version: int
    initial_state: str = "queued"


@pytest.fixture(scope="session")
def keel_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database under test: --dsn / $AGENTKEEL_DSN, else an embedded throwaway cluster."""
    dsn = request.config.getoption("--dsn") or os.environ.get("AGENTKEEL_DSN")
    if not dsn:
        with embedded_database() as embedded_dsn:
            yield embedded_dsn
        return
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        if request.config.getoption("--migrate"):
            migrate_up(conn, sql_root())
        row = conn.execute("select to_regproc('keel.transition_task') is not null").fetchone()
        if not row or not row[0]:
            pytest.exit(
                "the agentkeel schema is not installed in the --dsn database: run "
                "`agentkeel migrate up --dsn ...` first, or pass --migrate",
                returncode=4,
            )
    yield dsn


@pytest.fixture
def connect(keel_dsn: str) -> Iterator[Connect]:
    """Open extra connections (closed after the test); keyword arguments go to psycopg.connect."""
    opened: list[psycopg.Connection] = []

    def _connect(**kwargs: object) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        conn = psycopg.connect(
            keel_dsn, options=CONNECTION_OPTIONS, application_name="agentkeel-conformance", **kwargs
        )
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture
def keel(connect: Connect) -> Keel:
    """The client on its own autocommit connection: each call is one transaction."""
    return Keel(connect())


@pytest.fixture(scope="session")
def workflow(keel_dsn: str) -> Iterator[Workflow]:
    """A workflow version private to this test session, removed at the end."""
    wf = Workflow(f"{WORKFLOW_PREFIX}{uuid.uuid4().hex[:12]}", 1)
    with psycopg.connect(keel_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
        Keel(conn).define_workflow(wf.name, wf.version, wf.initial_state, EDGES)
    yield wf
    with psycopg.connect(keel_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
        conn.execute("delete from keel.workflows where workflow = %s", (wf.name,))


@pytest.fixture
def make_tenant(keel_dsn: str) -> Iterator[Callable[[], uuid.UUID]]:
    """Create fresh tenants; deleting them afterwards removes everything the test wrote."""
    made: list[uuid.UUID] = []

    def _make_tenant() -> uuid.UUID:
        tenant_id = uuid.uuid4()
        with psycopg.connect(keel_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
            Keel(conn).create_tenant(f"{TENANT_PREFIX}{tenant_id.hex[:12]}", tenant_id)
        made.append(tenant_id)
        return tenant_id

    yield _make_tenant
    if made:
        with psycopg.connect(keel_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
            conn.execute("delete from keel.tenants where tenant_id = any(%s)", (made,))


@pytest.fixture
def tenant(make_tenant: Callable[[], uuid.UUID]) -> uuid.UUID:
    """A fresh tenant for one test."""
    return make_tenant()


@pytest.fixture
def new_task(keel: Keel, tenant: uuid.UUID, workflow: Workflow) -> Callable[..., Task]:
    """Create a task of the suite's workflow in the test's tenant."""

    def _new_task(**kwargs: object) -> Task:
        return keel.create_task(tenant, workflow.name, workflow.version, **kwargs)  # type: ignore[arg-type]

    return _new_task
