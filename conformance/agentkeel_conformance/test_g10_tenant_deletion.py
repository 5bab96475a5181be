"""G10 Tenant deletion: keel.delete_tenant removes every row of a tenant, in bounded steps
that resume where they stopped, after destroying its data keys first; while it runs the
tenant is refused everywhere, and afterwards its id is never a tenant again; other tenants
are untouched; its events are kept as payload-free tombstones or removed, as asked."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel
from agentkeel.errors import (
    InvalidArgument,
    TenantContextMismatch,
    TenantDeleted,
    UnknownTenant,
    translate,
)
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant, inconclusive, tenant_snapshot, tenant_tables
from agentkeel_conformance.tenant_fill import fill_tenant

pytestmark = pytest.mark.guarantee("G10")

DELETE = "select relation, removed, finished from keel.delete_tenant(%s, %s, %s)"


def delete_step(owner: psycopg.Connection, tenant: uuid.UUID, events: str, batch: int) -> list[Any]:
    """One call of keel.delete_tenant, one transaction."""
    with owner.transaction():
        return owner.execute(DELETE, (tenant, events, batch)).fetchall()


def delete_all(
    owner: psycopg.Connection, tenant: uuid.UUID, events: str = "tombstone", batch: int = 1000
) -> list[list[Any]]:
    """Call keel.delete_tenant until it reports the tenant gone; every call's rows."""
    steps: list[list[Any]] = []
    for _ in range(10_000):
        steps.append(delete_step(owner, tenant, events, batch))
        if any(finished for _, _, finished in steps[-1]):
            return steps
    raise AssertionError("keel.delete_tenant never reported the tenant deleted")


def rows_of(owner: psycopg.Connection, tenant: uuid.UUID) -> dict[str, int]:
    """The tenant's rows in each tenant table (keel.tenant_tables, the catalog's list),
    counted by the suite itself, not by the functions under test."""
    counts: dict[str, int] = {}
    with in_tenant(owner, tenant):
        for table in tenant_tables(owner):
            query = sql.SQL("select count(*) from {} where tenant_id = %s").format(
                sql.Identifier(*table.split("."))
            )
            row = owner.execute(query, (tenant,)).fetchone()
            counts[table] = int(row[0]) if row else 0
    return counts


def deletion(owner: psycopg.Connection, tenant: uuid.UUID) -> dict[str, Any] | None:
    row = owner.execute(
        "select to_jsonb(d) from keel.tenant_deletions as d where d.deleted_tenant_id = %s",
        (tenant,),
    ).fetchone()
    return None if row is None else dict(row[0])


def tombstones(owner: psycopg.Connection, tenant: uuid.UUID) -> list[dict[str, Any]]:
    return [
        dict(r[0])
        for r in owner.execute(
            "select to_jsonb(t) from keel.task_event_tombstones as t"
            " where t.deleted_tenant_id = %s order by t.task_id, t.seq",
            (tenant,),
        )
    ]


@pytest.fixture
def owner(connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    return connect(owner=True)


@pytest.fixture
def filled(
    keel: Keel, make_tenant: Callable[[], uuid.UUID], workflow: Any
) -> Callable[[], uuid.UUID]:
    """A new tenant with rows in every kind of tenant table (tenant_fill.fill_tenant)."""

    def _filled() -> uuid.UUID:
        tenant = make_tenant()
        fill_tenant(keel.conn, tenant, workflow.name)
        return tenant

    return _filled


def test_deleting_a_tenant_removes_every_row_of_it_and_nothing_of_any_other(owner, filled):
    """Three tenants with rows in every kind of tenant table; the first is deleted in steps
    of at most 4 rows. keel.tenant_rows (the dry run) counted its rows right. Afterwards no
    tenant table (keel.tenant_tables, from the catalog)
    holds a row of it; each step removed at most 4 rows and the record counts, per table,
    every row the tenant had (so no delete cascaded past its step); every event became a
    tombstone with no payload; the other two tenants' rows are exactly as before.

    Mutation: deletion_order_skips_a_table"""
    doomed, kept_a, kept_b = filled(), filled(), filled()
    # The owner's rows of a tenant too: its own quota, retention period and a credit.
    owner.execute("select keel.set_tenant_quota(%s, 'max_task_checkpoints', 50)", (doomed,))
    owner.execute("select keel.set_tenant_retention(%s, 'retain_inbox', '1 day')", (doomed,))
    with in_tenant(owner, doomed):  # a purge's credit of checkpoint bytes, as keel.purge writes it
        owner.execute(
            "insert into keel.tenant_usage_credits (tenant_id, counter, amount)"
            " values (%s, 'checkpoint_bytes', 1)",
            (doomed,),
        )
    before = rows_of(owner, doomed)
    assert all(before.values()), f"a tenant table the test wrote nothing to: {before}"
    with in_tenant(owner, doomed):
        dry_run = owner.execute("select * from keel.tenant_rows(%s)", (doomed,)).fetchall()
    assert dict(dry_run) == before, "keel.tenant_rows (the dry run) miscounts"
    with in_tenant(owner, doomed):
        events = owner.execute(
            "select task_id, seq, event_type, to_state, actor from keel.task_events"
            " where tenant_id = %s order by task_id, seq",
            (doomed,),
        ).fetchall()
    others = {t: tenant_snapshot(owner, t) for t in (kept_a, kept_b)}

    steps = delete_all(owner, doomed, "tombstone", 4)
    assert len(steps) > 3
    for step in steps:
        assert sum(removed for _, removed, _ in step) <= 4 or step[-1][0] == "keel.tenants"

    left = {table: n for table, n in rows_of(owner, doomed).items() if n}
    assert not left, f"rows of the deleted tenant are left: {left}"
    record = deletion(owner, doomed)
    assert record is not None and record["finished_at"] is not None
    assert record["removed"] == {r: n for r, n in before.items() if n}, (
        "rows went without being counted: a delete cascaded past its step"
    )
    kept = tombstones(owner, doomed)
    assert [
        (uuid.UUID(t["task_id"]), t["seq"], t["event_type"], t["to_state"], t["actor"])
        for t in kept
    ] == events
    assert all("payload" not in t and "trace_id" not in t for t in kept)
    for t, snapshot in others.items():
        assert tenant_snapshot(owner, t) == snapshot, "another tenant's rows changed"


def test_the_first_step_destroys_the_data_keys_and_refuses_the_tenant_everywhere(
    owner, keel, filled, workflow
):
    """After the first step (one row), before any other row is gone: the tenant's wrapped
    data keys are erased, and every call for it is refused with tenant_deleted (55K17):
    create a task, transition, read a task, create the tenant again. After the last step,
    creating a tenant with its id is still refused.

    Mutation: keys_destroyed_last; also deleted_tenant_served"""
    tenant = filled()
    with in_tenant(owner, tenant):
        task_id = owner.execute(
            "select task_id from keel.tasks where tenant_id = %s limit 1", (tenant,)
        ).fetchone()[0]
    delete_step(owner, tenant, "tombstone", 1)
    with in_tenant(owner, tenant):
        keys = owner.execute(
            "select count(*) filter (where wrapped_key is not null), count(*)"
            " from keel.tenant_data_keys where tenant_id = %s",
            (tenant,),
        ).fetchone()
    assert keys is not None and keys[0] == 0, "a data key survived the first step"
    calls: dict[str, Callable[[], object]] = {
        "create_task": lambda: keel.create_task(tenant, workflow.name, workflow.version),
        "transition_task": lambda: keel.transition_task(tenant, task_id, 3, "running"),
        "get_task": lambda: keel.get_task(tenant, task_id),
        "create_tenant": lambda: keel.create_tenant("again", tenant),
    }
    for name, call in calls.items():
        with pytest.raises(TenantDeleted):
            call()
            pytest.fail(f"{name} was served for a tenant being deleted")
    delete_all(owner, tenant)
    with pytest.raises(TenantDeleted):
        keel.create_tenant("again", tenant)


def test_an_interrupted_deletion_resumes_and_a_finished_one_stays_finished(
    owner, filled, connect, direct_connection
):
    """A step whose connection is killed before it commits leaves what the committed steps
    did; the next calls carry on to the end. Calling again after the end reports it
    finished. A resumed deletion with the other events policy is refused (22K01).

    Mutation: resumed_with_another_policy"""
    tenant = filled()
    before = rows_of(owner, tenant)
    delete_step(owner, tenant, "remove", 3)
    victim = connect(owner=True, autocommit=False)
    victim.execute(DELETE, (tenant, "remove", 5)).fetchall()
    pid = victim.info.backend_pid
    # ::integer: Citus adds pg_terminate_backend(bigint global pid, bigint), which makes
    # a smallint argument ambiguous.
    owner.execute("select pg_terminate_backend(%s::integer)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        victim.execute("select 1")
    with pytest.raises(InvalidArgument):
        _call(owner, tenant, "tombstone", 5)
    delete_all(owner, tenant, "remove", 5)
    record = deletion(owner, tenant)
    assert record is not None and record["removed"] == {r: n for r, n in before.items() if n}
    assert tombstones(owner, tenant) == []
    assert delete_step(owner, tenant, "remove", 5) == [(None, 0, True)]


def test_writers_racing_the_deletion_leave_no_row_behind(owner, keel, filled, workflow, role_dsn):
    """Two application logins keep creating and moving tasks of the tenant while it is
    deleted in steps. Each of their calls either completes before the tenant is marked or
    is refused (tenant_deleted, or its foreign key once the tenant's row is gone); no call
    begun after the first step committed is served, and when the deletion reports the end
    no row of the tenant is left in any tenant table.

    Mutation: deleted_tenant_served"""
    tenant = filled()
    stop, marked = threading.Event(), threading.Event()
    refused: list[str] = []
    served_after_mark: list[str] = []
    unexpected: list[BaseException] = []

    def write() -> None:
        with suite_connect(role_dsn("keel_app"), autocommit=True) as conn:
            writer = Keel(conn)
            while not stop.is_set():
                after_mark = marked.is_set()
                try:
                    task = writer.create_task(tenant, workflow.name, workflow.version)
                    if after_mark:
                        served_after_mark.append("create_task")
                    writer.transition_task(tenant, task.task_id, task.state_version, "running")
                except TenantDeleted:
                    refused.append("55K17")
                except psycopg.errors.ForeignKeyViolation:
                    refused.append("23503")
                except BaseException as err:
                    unexpected.append(err)
                    return

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        while rows_of(owner, tenant)["keel.tasks"] <= 2 and not unexpected:
            time.sleep(0.01)  # until the writers are at work: a task of theirs exists
        delete_step(owner, tenant, "tombstone", 7)
        marked.set()
        delete_all(owner, tenant, "tombstone", 7)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not unexpected, unexpected
    assert not served_after_mark, "a call begun after the first step was served"
    assert sum(rows_of(owner, tenant).values()) == 0
    if not refused:  # the writers never met the deletion: nothing was shown either way
        inconclusive("no writer call was refused: the writers never met the deletion")


def test_only_the_owner_deletes_and_bad_arguments_are_refused(
    owner, login_role, tenant, make_tenant
):
    """Every application role is refused EXECUTE on keel.delete_tenant and
    keel.tenant_rows; the owner gets invalid_argument for an unknown events policy or a
    step size out of range or the nil uuid, unknown_tenant for a tenant that never existed,
    and tenant_context_mismatch inside a transaction acting for another tenant.

    Mutation: deletion_step_unbounded"""
    for role in ("keel_app", "keel_worker", "keel_agent", "keel_relay", "keel_auditor"):
        with suite_connect(login_role(role).dsn, autocommit=True) as conn:
            for query in (DELETE, "select * from keel.tenant_rows(%s)"):
                params = (tenant, "remove", 10) if query == DELETE else (tenant,)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(query, params)
    for events, batch, error in (
        ("shred", 10, InvalidArgument),
        (None, 10, InvalidArgument),
        ("remove", 0, InvalidArgument),
        ("remove", 100_001, InvalidArgument),
        ("remove", None, InvalidArgument),
    ):
        with pytest.raises(error):
            _call(owner, tenant, events, batch)
    with pytest.raises(UnknownTenant):
        _call(owner, uuid.uuid4(), "remove", 10)
    with pytest.raises(InvalidArgument):
        _call(owner, uuid.UUID(int=0), "remove", 10)  # the nil uuid names no tenant
    with pytest.raises(TenantContextMismatch), owner.transaction():
        owner.execute("select keel.use_tenant(%s)", (make_tenant(),))
        _raise(owner, DELETE, (tenant, "remove", 10))
    with pytest.raises(InvalidArgument), owner.transaction():
        _raise(owner, "select * from keel.tenant_rows(%s)", (uuid.UUID(int=0),))
    assert deletion(owner, tenant) is None and rows_of(owner, tenant)["keel.tenants"] == 1


def _call(owner: psycopg.Connection, tenant: uuid.UUID, events: object, batch: object) -> None:
    with owner.transaction():
        _raise(owner, DELETE, (tenant, events, batch))


def _raise(owner: psycopg.Connection, query: str, params: tuple[object, ...]) -> None:
    """Run query; a keel SQLSTATE comes back as its agentkeel.errors class."""
    try:
        owner.execute(query, params).fetchall()
    except psycopg.Error as err:
        raise (translate(err) or err) from err
