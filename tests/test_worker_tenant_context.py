"""Worker-side tenant context (issue 9 item 2, CITUS.md rule 14): once keel.require_tenant
has verified a caller's context, the transaction carries the verified tenant as the plain
`SET LOCAL keel.tenant_id` (and its stamp), which is what a Citus worker, trusting only the
plain setting, sees. Checked on PostgreSQL alone: the value set is exactly the verified
one, and it widens nothing for an agent, whose context still comes from its token only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel
from conftest import temporary_login

WORKFLOW = "worker-context"


@pytest.fixture
def agent_dsn(migrated_db: str) -> Iterator[str]:
    with temporary_login(migrated_db, "keel_agent") as dsn:
        yield dsn


@pytest.fixture
def two_tenants(migrated_db: str) -> tuple[tuple[uuid.UUID, uuid.UUID, str], uuid.UUID]:
    """Tenant A with a task and an agent token, and tenant B with a task."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow(WORKFLOW, 1, "queued", [("queued", "running")])
        a = keel.create_tenant("worker-a").tenant_id
        b = keel.create_tenant("worker-b").tenant_id
        task_a = keel.create_task(a, WORKFLOW, 1).task_id
        keel.create_task(b, WORKFLOW, 1)
        token = keel.mint_tenant_token(a, timedelta(minutes=5))
    return (a, task_a, token), b


def _setting(conn: psycopg.Connection, name: str) -> str | None:
    row = conn.execute("select current_setting(%s, true)", (name,)).fetchone()
    assert row is not None
    return row[0]


def test_after_an_agent_call_the_transaction_carries_exactly_the_verified_tenant(
    agent_dsn, two_tenants
):
    (a, task_a, token), b = two_tenants
    with psycopg.connect(agent_dsn, autocommit=True) as conn, conn.transaction():
        # A hostile agent plants another tenant's id as the plain context first.
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(str(b)))
        conn.execute(
            "select set_config('keel.tenant_token', %s, true), keel.bind_tenant_context()",
            (token,),
        )
        assert conn.execute(
            "select task_id from keel.get_task(%s, %s)", (a, task_a)
        ).fetchone() == (task_a,)
        # The verified tenant replaced the planted one, with this transaction's stamp.
        assert _setting(conn, "keel.tenant_id") == str(a)
        assert (
            _setting(conn, "keel.context_stamp")
            == conn.execute("select keel.context_stamp()").fetchone()[0]
        )
        # Nothing widened: the agent's context is still its token's tenant, and the
        # plain setting it now carries gives it no other tenant.
        assert conn.execute("select keel.current_tenant()").fetchone() == (a,)
        with pytest.raises(psycopg.Error) as err, conn.transaction():
            conn.execute("select * from keel.list_tasks(%s)", (b,))
        assert err.value.sqlstate == "42K06"
    with psycopg.connect(agent_dsn, autocommit=True) as conn, conn.transaction():
        # Without a token, a plain context of the verified tenant is still no context.
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(str(a)))
        conn.execute("select keel.bind_tenant_context()")
        assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
        with pytest.raises(psycopg.Error) as err:
            conn.execute("select * from keel.get_task(%s, %s)", (a, task_a))
        assert err.value.sqlstate == "42K01"


def test_a_refused_call_sets_no_context(agent_dsn, two_tenants):
    (_a, _, token), b = two_tenants
    with psycopg.connect(agent_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(
            "select set_config('keel.tenant_token', %s, true), keel.bind_tenant_context()",
            (token,),
        )
        with pytest.raises(psycopg.Error) as err, conn.transaction():
            conn.execute("select * from keel.list_tasks(%s)", (b,))
        assert err.value.sqlstate == "42K06"
        assert _setting(conn, "keel.tenant_id") in (None, "")


def test_a_trusted_call_keeps_its_own_tenant_and_a_stable_reader_may_call_it(
    migrated_db, two_tenants
):
    (a, task_a, _), _b = two_tenants
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(sql.SQL("set local keel.tenant_id = {}").format(str(a)))
            conn.execute("select keel.bind_tenant_context()")
            # get_task is a STABLE function: the volatile require_tenant it calls may SET.
            conn.execute("select * from keel.get_task(%s, %s)", (a, task_a))
            assert _setting(conn, "keel.tenant_id") == str(a)
        # The transaction is over: so is the context it set.
        assert _setting(conn, "keel.tenant_id") in (None, "")
