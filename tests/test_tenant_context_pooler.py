"""The tenant context is transaction-scoped in the database itself (G1), through PgBouncer.

PgBouncer in transaction mode hands one server connection to client after client without
resetting it. A context one client left at session level (``set_config(..., false)``, a
plain ``SET``) must not reach the next client of that backend: the database ignores a
context not bound to the current transaction, so the next client sees nothing, an
agent's API calls fail with tenant_context_missing (42K01); a trusted login's calls run
only in the tenant they name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.client import Keel
from pgbouncer import PgBouncer, PgBouncerNotFound

WORKFLOW = "pooled"

# The same careless client code, three ways: the context, and a marker for this
# transaction, left at session level.
SESSION_LEVEL_TRUSTED = (
    "select set_config('keel.tenant_id', %(tenant)s, false),"
    " set_config('keel.context_stamp', extract(epoch from now())::text, false)",
    "set keel.tenant_id = %(tenant_literal)s",
)


@pytest.fixture
def one_backend(migrated_db: str) -> Iterator[Callable[[str], str]]:
    """A PgBouncer in transaction mode with a pool of one server connection per login:
    consecutive clients of a login share one backend."""
    params = conninfo.conninfo_to_dict(migrated_db)
    try:
        bouncer = PgBouncer(
            str(params.get("host") or "127.0.0.1"),
            int(str(params.get("port") or 5432)),
            pool_size=1,
        ).start()
    except PgBouncerNotFound as err:
        pytest.skip(str(err))
    try:
        yield bouncer.dsn_for
    finally:
        bouncer.cleanup()


@pytest.fixture
def logins(migrated_db: str) -> Iterator[dict[str, str]]:
    """Login roles in keel_app and keel_agent (cluster-wide, dropped afterwards)."""
    suffix = uuid.uuid4().hex[:8]
    names = {"app": f"akt_app_{suffix}", "agent": f"akt_agent_{suffix}"}
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        for kind, name in names.items():
            conn.execute(
                sql.SQL("create role {} login in role {}").format(
                    sql.Identifier(name), sql.Identifier(f"keel_{kind}")
                )
            )
    try:
        yield {kind: conninfo.make_conninfo(migrated_db, user=n) for kind, n in names.items()}
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            for name in names.values():
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


@pytest.fixture
def tenant_task(migrated_db: str) -> tuple[uuid.UUID, uuid.UUID, str]:
    """A tenant with one task, and an agent token for it."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow(WORKFLOW, 1, "queued", [("queued", "running")])
        tenant = keel.create_tenant("pooled-a").tenant_id
        task = keel.create_task(tenant, WORKFLOW, 1).task_id
        token = keel.mint_tenant_token(tenant, timedelta(minutes=5))
    return tenant, task, token


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None)


def _pid(conn: psycopg.Connection) -> int:
    row = conn.execute("select pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def _sees_nothing(
    conn: psycopg.Connection, tenant: uuid.UUID, task: uuid.UUID, *, trusted: bool = False
) -> None:
    """The leftover is not this transaction's context. An agent's call has none (42K01); a
    trusted login's call runs in the tenant it names, so naming another tenant finds no
    row (had the leftover been honoured, that call would be a mismatch, 42K06)."""
    assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
    if trusted:
        row = conn.execute(
            "select count(*) from keel.get_task(%s, %s)", (uuid.uuid4(), task)
        ).fetchone()
        assert row == (0,)
        return
    with pytest.raises(psycopg.Error) as err:
        conn.execute("select * from keel.get_task(%s, %s)", (tenant, task))
    assert err.value.sqlstate == "42K01", err.value


@pytest.mark.parametrize("leftover", SESSION_LEVEL_TRUSTED, ids=["set_config", "set"])
def test_a_trusted_session_context_does_not_reach_the_next_pooled_client(
    one_backend, logins, tenant_task, leftover
):
    tenant, task, _ = tenant_task
    pooled = one_backend(logins["app"])
    with connect(pooled) as a:
        a.execute(
            leftover.replace("%(tenant_literal)s", sql.Literal(str(tenant)).as_string(None)),
            {"tenant": str(tenant)} if "%(tenant)s" in leftover else None,
        )
        pid_a = _pid(a)
    with connect(pooled) as b:
        assert _pid(b) == pid_a  # the same backend: the leftover GUC is really there
        assert b.execute("select count(*) from keel.tasks").fetchone() == (0,)
        assert b.execute("select count(*) from keel.tenants").fetchone() == (0,)
        _sees_nothing(b, tenant, task, trusted=True)
        # The client's own per-call context still works on that backend.
        assert Keel(b).get_task(tenant, task) is not None
        _sees_nothing(b, tenant, task, trusted=True)  # and it ended with its transaction
        assert b.execute("select count(*) from keel.tasks").fetchone() == (0,)


def test_an_agent_session_token_does_not_reach_the_next_pooled_client(
    one_backend, logins, tenant_task
):
    tenant, task, token = tenant_task
    pooled = one_backend(logins["agent"])
    with connect(pooled) as a:
        a.execute(
            "select set_config('keel.tenant_token', %s, false),"
            " set_config('keel.context_stamp', extract(epoch from now())::text, false)",
            (token,),
        )
        pid_a = _pid(a)
    with connect(pooled) as b:
        assert _pid(b) == pid_a
        _sees_nothing(b, tenant, task)
        assert Keel(b, tenant_token=token).get_task(tenant, task) is not None


def test_a_context_set_by_the_documented_forms_works_through_the_pooler(
    one_backend, logins, tenant_task
):
    tenant, task, token = tenant_task
    with connect(one_backend(logins["app"])) as app, app.transaction():
        app.execute(sql.SQL("set local keel.tenant_id = {}").format(str(tenant)))
        app.execute("select keel.bind_tenant_context()")
        assert app.execute("select count(*) from keel.tasks").fetchone() == (1,)
    with connect(one_backend(logins["agent"])) as agent, agent.transaction():
        agent.execute(
            "select set_config('keel.tenant_token', %s, true), keel.bind_tenant_context()",
            (token,),
        )
        assert agent.execute(
            "select task_id from keel.get_task(%s, %s)", (tenant, task)
        ).fetchone() == (task,)


@pytest.mark.parametrize("agent", [False, True], ids=["trusted", "agent"])
def test_clients_sharing_a_pooled_backend_do_not_run_each_others_prepared_statements(
    one_backend, logins, tenant_task, agent
):
    """Two Keel clients on psycopg's defaults (prepared after 5 runs of a statement), one
    PgBouncer 1.18 backend: each client's first prepared statement is named _pg3_0, so
    without the client's pooler check the second would fail (already exists) or run the
    other's statement. The client sees the pooler and prepares nothing."""
    tenant, task, token = tenant_task
    pooled = one_backend(logins["agent" if agent else "app"])
    with (
        psycopg.connect(pooled, autocommit=True) as a,
        psycopg.connect(pooled, autocommit=True) as b,
    ):
        first = Keel(a, tenant_token=token) if agent else Keel(a)
        second = Keel(b, tenant_token=token) if agent else Keel(b)
        for _ in range(8):
            assert first.get_task(tenant, task).task_id == task
            assert [t.task_id for t in second.list_tasks(tenant)] == [task]
            assert len(second.task_events(tenant, task)) >= 1
        assert first.pooled is True and second.pooled is True
        assert a.prepare_threshold is None and b.prepare_threshold is None


def test_a_direct_connection_keeps_prepared_statements(migrated_db, logins, tenant_task):
    tenant, task, _ = tenant_task
    with psycopg.connect(logins["app"], autocommit=True) as conn:
        keel = Keel(conn)
        for _ in range(6):
            keel.get_task(tenant, task)
        assert keel.pooled is False and conn.prepare_threshold == 5
        prepared = conn.execute("select count(*) from pg_prepared_statements").fetchone()
        assert prepared is not None and prepared[0] >= 1


def test_a_client_told_the_pooler_keeps_prepared_statements_does_not_check(
    one_backend, logins, tenant_task
):
    tenant, task, _ = tenant_task
    with psycopg.connect(one_backend(logins["app"]), autocommit=True) as conn:
        keel = Keel(conn, detect_pooler=False)
        keel.get_task(tenant, task)
        assert keel.pooled is None and conn.prepare_threshold == 5
