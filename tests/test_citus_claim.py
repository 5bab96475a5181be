"""The Citus variant of keel.claim_next_tasks (tools/agentkeel/citus/claim_next_tasks.sql,
installed by `agentkeel distribute`), run on PostgreSQL alone: the unlocked candidate scan
plus per-tenant SKIP LOCKED claim must keep the shipped claim's contract, and it refuses
(55K20), never returns nothing, when its SET LOCAL settings would not reach the workers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel
from agentkeel.distribute import CITUS_VARIANTS
from conftest import temporary_login

WORKFLOW = "citus-claim"
CLAIM = "select tenant_id, task_id, fencing_token from keel.claim_next_task(%s, p_workflow => %s)"


@pytest.fixture
def variant_db(migrated_db: str) -> str:
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        for path in CITUS_VARIANTS:
            conn.execute(path.read_text().encode())
        dbname = conn.info.dbname
        conn.execute(
            sql.SQL("alter database {} set citus.propagate_set_commands = 'local'").format(
                sql.Identifier(dbname)
            )
        )
        Keel(conn).define_workflow(WORKFLOW, 1, "queued", [("queued", "running")])
    return migrated_db


@pytest.fixture
def worker(variant_db: str) -> Iterator[str]:
    with temporary_login(variant_db, "keel_worker") as dsn:
        yield dsn


def _tasks(dsn: str, per_tenant: list[int]) -> list[tuple[uuid.UUID, list[uuid.UUID]]]:
    """Tenants with due tasks, created oldest first in the order given."""
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        keel = Keel(conn)
        for n in per_tenant:
            tenant = keel.create_tenant(f"citus-{uuid.uuid4().hex[:6]}").tenant_id
            out.append((tenant, [keel.create_task(tenant, WORKFLOW, 1).task_id for _ in range(n)]))
    return out


def test_it_is_the_installed_variant(variant_db):
    with psycopg.connect(variant_db) as conn:
        row = conn.execute(
            "select obj_description("
            "'keel.claim_next_tasks(text, integer, interval, text)'::regprocedure)"
        ).fetchone()
    assert row is not None and row[0].startswith("Citus variant")


def test_autocommit_claims_the_oldest_due_task_of_any_tenant_and_sets_its_context(
    worker, variant_db
):
    (a, a_tasks), (b, b_tasks) = _tasks(variant_db, [2, 1])
    with psycopg.connect(worker, autocommit=True) as conn:
        claimed = [conn.execute(CLAIM, ("w", WORKFLOW)).fetchone() for _ in range(4)]
    assert [c[:2] if c else None for c in claimed] == [
        (a, a_tasks[0]),
        (a, a_tasks[1]),
        (b, b_tasks[0]),
        None,  # nothing due any more: no row, no error
    ]
    assert all(c[2] == 1 for c in claimed[:3] if c)
    with psycopg.connect(worker, autocommit=True) as conn, conn.transaction():
        conn.execute(CLAIM, ("w", WORKFLOW))  # nothing claimable: the context is cleared
        assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
    ((c, c_tasks),) = _tasks(variant_db, [1])
    with psycopg.connect(worker, autocommit=True) as conn, conn.transaction():
        assert conn.execute(CLAIM, ("w", WORKFLOW)).fetchone()[:2] == (c, c_tasks[0])
        assert conn.execute("select keel.current_tenant()").fetchone() == (c,)


def test_locked_candidates_beyond_a_batch_do_not_stall_another_tenants_claim(worker, variant_db):
    """Tenant A's 70 due tasks (more than two candidate batches) are locked and due
    first; the claim still takes B's task, in one call, without waiting."""
    (a, a_tasks), (b, b_tasks) = _tasks(variant_db, [70, 1])
    with psycopg.connect(variant_db, autocommit=True) as holder, holder.transaction():
        holder.execute(sql.SQL("set local keel.tenant_id = {}").format(str(a)))
        holder.execute("select keel.bind_tenant_context()")
        holder.execute(
            "select 1 from keel.tasks where tenant_id = %s and task_id = any(%s) for update",
            (a, a_tasks),
        )
        with psycopg.connect(worker, autocommit=True) as conn:
            conn.execute("set lock_timeout = '5s'")
            row = conn.execute(CLAIM, ("w", WORKFLOW)).fetchone()
            assert row is not None and row[:2] == (b, b_tasks[0])
            assert conn.execute(CLAIM, ("w", WORKFLOW)).fetchone() is None


def test_concurrent_claimers_get_distinct_tasks(worker, variant_db):
    _tasks(variant_db, [1, 1])
    with (
        psycopg.connect(worker, autocommit=True) as one,
        psycopg.connect(worker, autocommit=True) as two,
        one.transaction(),
        two.transaction(),
    ):
        first = one.execute(CLAIM, ("w1", WORKFLOW)).fetchone()
        second = two.execute(CLAIM, ("w2", WORKFLOW)).fetchone()
        assert first is not None and second is not None
        assert first[:2] != second[:2]


def test_it_refuses_when_set_local_would_not_reach_the_workers(worker, variant_db):
    _tasks(variant_db, [1])
    with psycopg.connect(worker, autocommit=True) as conn:
        conn.execute("set citus.propagate_set_commands = 'none'")
        with pytest.raises(psycopg.Error) as err:
            conn.execute(CLAIM, ("w", WORKFLOW))
        assert err.value.sqlstate == "55K20"
        assert "would not reach the worker nodes" in str(err.value)
