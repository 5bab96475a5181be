"""The worker-side tenant context on Citus (issue 9): the Citus variant of
keel.context_stamp (tools/agentkeel/citus/, installed by `agentkeel distribute`) and the
shipped keel.context_relayed it calls, run on PostgreSQL.

A Citus worker runs its part of a distributed transaction with the coordinator's
SET LOCAL keel.tenant_id and keel.context_stamp, and the stamp is the coordinator's now(),
not the worker's. Citus cannot be installed here, so the two pieces of its interface the
variant reads are stood in for, in this test's own database only:
pg_catalog.get_current_transaction_id() (initiator group and distributed transaction
number, as assign_distributed_transaction_id leaves them for the transaction) and the
one-row table pg_catalog.pg_dist_local_group (this node's group). They stand for what Citus
provides; whether Citus propagates the SET LOCALs as its source says is for a real cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel
from agentkeel.distribute import CITUS_VARIANTS
from conftest import temporary_login

WORKFLOW = "citus-context"
COORDINATOR_STAMP = "1733200000.123456"  # the coordinator's now(), never this node's
WORKER_GROUP = 2

STANDINS = f"""
set allow_system_table_mods = on;
create table pg_catalog.pg_dist_local_group (groupid integer not null);
insert into pg_catalog.pg_dist_local_group values ({WORKER_GROUP});
grant select on pg_catalog.pg_dist_local_group to public;
create function pg_catalog.get_current_transaction_id(
    out database_id oid, out process_id integer, out initiator_node_identifier integer,
    out transaction_number bigint, out transaction_stamp timestamptz
)
language sql volatile
as $$
    select 0::oid, pg_backend_pid(),
        coalesce(nullif(current_setting('citus_standin.initiator', true), ''), '0')::integer,
        coalesce(nullif(current_setting('citus_standin.number', true), ''), '0')::bigint,
        null::timestamptz
$$;
"""


@pytest.fixture
def cluster_node(migrated_db: str) -> tuple[str, uuid.UUID, uuid.UUID]:
    """A database with the Citus variants and the stand-ins; tenant A has two tasks, B one."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        for path in CITUS_VARIANTS:
            conn.execute(path.read_text().encode())
        conn.execute(STANDINS.encode())
        keel = Keel(conn)
        keel.define_workflow(WORKFLOW, 1, "queued", [("queued", "running")])
        a = keel.create_tenant("citus-a").tenant_id
        b = keel.create_tenant("citus-b").tenant_id
        for tenant, n in ((a, 2), (b, 1)):
            for _ in range(n):
                keel.create_task(tenant, WORKFLOW, 1)
    return migrated_db, a, b


@pytest.fixture
def owner_login(cluster_node: tuple[str, uuid.UUID, uuid.UUID]) -> Iterator[str]:
    """As a worker connection of a SECURITY DEFINER function runs: a keel_owner login."""
    with temporary_login(cluster_node[0], "keel_owner") as dsn:
        yield dsn


@pytest.fixture
def agent_login(cluster_node: tuple[str, uuid.UUID, uuid.UUID]) -> Iterator[str]:
    with temporary_login(cluster_node[0], "keel_agent") as dsn:
        yield dsn


def _worker_part(
    conn: psycopg.Connection,
    *,
    initiator: int | None,
    tenant: uuid.UUID | None,
    stamp: str | None = COORDINATOR_STAMP,
) -> None:
    """Open a transaction as Citus opens a worker's part of one: BEGIN, the propagated
    SET LOCALs, then the distributed transaction id (none when initiator is None)."""
    conn.execute("begin")
    if tenant is not None:
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(sql.Literal(str(tenant))))
    if stamp is not None:
        conn.execute(sql.SQL("set local keel.context_stamp = {}").format(sql.Literal(stamp)))
    if initiator is not None:
        conn.execute(
            sql.SQL("set local citus_standin.initiator = {}").format(sql.Literal(str(initiator)))
        )
        conn.execute("set local citus_standin.number = '41'")


def _seen(conn: psycopg.Connection) -> tuple[uuid.UUID | None, list[uuid.UUID]]:
    """The tenant of the transaction and the tenants whose tasks RLS shows."""
    row = conn.execute("select keel.current_tenant()").fetchone()
    assert row is not None
    tenants = [r[0] for r in conn.execute("select tenant_id from keel.tasks order by 1")]
    return row[0], tenants


def test_a_worker_honours_the_stamp_the_coordinator_propagated(cluster_node, owner_login):
    """Issue 9: as shipped, every context read as none on a worker (its now() is not the
    coordinator's). Fails with the PostgreSQL keel.context_stamp."""
    _, a, _ = cluster_node
    with psycopg.connect(owner_login) as conn:
        # Initiated by the coordinator (group 0), or by another worker (Citus MX).
        for initiator in (0, WORKER_GROUP + 3):
            _worker_part(conn, initiator=initiator, tenant=a)
            assert _seen(conn) == (a, [a, a])
            conn.execute("rollback")


def test_the_same_settings_outside_a_relayed_transaction_count_for_nothing(
    cluster_node, owner_login
):
    """No distributed transaction id, or one this node initiated (a client connected
    here): the stamp must be this transaction's now(), as on PostgreSQL."""
    _, a, _ = cluster_node
    with psycopg.connect(owner_login) as conn:
        for initiator in (None, WORKER_GROUP):
            _worker_part(conn, initiator=initiator, tenant=a)
            assert _seen(conn) == (None, [])
            conn.execute("rollback")


def test_a_relayed_transaction_without_a_stamp_has_no_context(cluster_node, owner_login):
    _, a, _ = cluster_node
    with psycopg.connect(owner_login) as conn:
        for stamp in (None, ""):
            _worker_part(conn, initiator=0, tenant=a, stamp=stamp)
            assert _seen(conn) == (None, [])
            conn.execute("rollback")


def test_a_relayed_plain_tenant_id_still_means_nothing_to_an_agent(cluster_node, agent_login):
    """The relayed stamp only ties a context to the transaction; an untrusted login still
    needs its signed token."""
    _, a, _ = cluster_node
    with psycopg.connect(agent_login) as conn:
        _worker_part(conn, initiator=0, tenant=a)
        row = conn.execute("select keel.current_tenant()").fetchone()
        assert row == (None,)


def test_a_session_level_stamp_is_not_carried_into_a_later_transaction(cluster_node, owner_login):
    """Where the transaction begins (not relayed), a context left at session level by an
    earlier client is ignored, and binding in a new transaction stamps that transaction."""
    _, a, b = cluster_node
    with psycopg.connect(owner_login, autocommit=True) as conn:
        conn.execute("begin")
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(sql.Literal(str(a))))
        conn.execute("select keel.bind_tenant_context()")
        row = conn.execute("select current_setting('keel.context_stamp')").fetchone()
        assert row is not None
        stamp = row[0]
        conn.execute("commit")
        conn.execute(
            sql.SQL("select set_config('keel.context_stamp', {}, false)").format(sql.Literal(stamp))
        )
        conn.execute(
            sql.SQL("select set_config('keel.tenant_id', {}, false)").format(sql.Literal(str(b)))
        )
        with conn.transaction():
            assert _seen(conn) == (None, [])
            conn.execute("select keel.bind_tenant_context()")
            row = conn.execute("select current_setting('keel.context_stamp')").fetchone()
            assert row is not None and row[0] != stamp
            assert _seen(conn) == (b, [b])


def test_without_citus_the_variant_behaves_as_the_shipped_function(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        assert conn.execute("select keel.context_relayed()").fetchone() == (False,)
        for path in CITUS_VARIANTS:
            conn.execute(path.read_text().encode())
        with conn.transaction():
            conn.execute("set local keel.context_stamp = '1733200000.123456'")
            row = conn.execute(
                "select keel.context_stamp() = (extract(epoch from now()))::text"
            ).fetchone()
            assert row == (True,)


@pytest.fixture
def app_login(cluster_node: tuple[str, uuid.UUID, uuid.UUID]) -> Iterator[str]:
    with temporary_login(cluster_node[0], "keel_app") as dsn:
        yield dsn


def test_application_roles_still_read_after_the_privileges_are_applied_again(
    cluster_node, app_login
):
    """`migrate up` after distribute re-applies policies/03_privileges.sql, which revokes
    every keel function from PUBLIC: every function the policies reach, the variant's
    keel.context_relayed included, must stay granted (a policy's functions are checked
    for EXECUTE whether or not their branch runs)."""
    dsn, a, _ = cluster_node
    privileges = Path(__file__).resolve().parents[1] / "policies" / "03_privileges.sql"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(privileges.read_text().encode())
    with psycopg.connect(app_login) as conn:
        assert _seen(conn) == (None, [])
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(sql.Literal(str(a))))
        conn.execute("select keel.bind_tenant_context()")
        assert _seen(conn) == (a, [a, a])
