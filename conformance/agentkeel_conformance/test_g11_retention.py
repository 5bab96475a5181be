"""G11 Retention: keel.purge removes, in bounded steps, what a tenant's retention periods
say is finished with (finished tasks with all they own, expired idempotency keys, old
checkpoints, closed sessions, delivered and dead messages, inbox rows), never a live row,
never waiting on a lock, and beside traffic loses nothing live."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel.errors import InvalidArgument, translate
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant, inconclusive, tenant_snapshot
from agentkeel_conformance.tenant_fill import FILL_KEY, fill_tenant

pytestmark = pytest.mark.guarantee("G11")

SETTINGS = (
    "retain_finished_tasks",
    "retain_closed_sessions",
    "retain_old_checkpoints",
    "retain_delivered_messages",
    "retain_dead_messages",
    "retain_inbox",
)
PURGE = "select kind, relation, removed from keel.purge(%s, %s)"


def purge_step(
    owner: psycopg.Connection, tenant: uuid.UUID, batch: int, lock_timeout: str | None = None
) -> int:
    """One keel.purge step, one transaction; it must stay within batch. Rows removed."""
    with owner.transaction():
        if lock_timeout is not None:  # SET LOCAL: it holds through a transaction pooler too
            owner.execute("select set_config('lock_timeout', %s, true)", (lock_timeout,))
        removed = sum(r[2] for r in owner.execute(PURGE, (tenant, batch)).fetchall())
    assert removed <= batch, f"a step of {batch} removed {removed} rows"
    return int(removed)


def purge_all(
    owner: psycopg.Connection,
    tenant: uuid.UUID,
    batch: int = 1000,
    lock_timeout: str | None = None,
) -> int:
    """keel.purge steps until one removes less than batch. The rows removed in all."""
    total = 0
    for _ in range(10_000):
        removed = purge_step(owner, tenant, batch, lock_timeout)
        total += removed
        if removed < batch:
            return total
    raise AssertionError("the purge never finished")


def retain_nothing(owner: psycopg.Connection, tenant: uuid.UUID) -> None:
    """Every retention period of the tenant set to 0: all that is finished is due now."""
    for setting in SETTINGS:
        owner.execute("select keel.set_tenant_retention(%s, %s, '0')", (tenant, setting))


def ids(owner: psycopg.Connection, tenant: uuid.UUID, query: str) -> set[Any]:
    with in_tenant(owner, tenant):
        return {r[0] for r in owner.execute(query, (tenant,))}


def deliver(relay_dsn: str, topic: str) -> None:
    """A relay login claims and acks every message of the topic."""
    with suite_connect(relay_dsn, autocommit=True) as conn:
        relay = Keel(conn)
        while claimed := relay.claim_outbox("g11-relay", 100, topic_prefix=topic):
            for m in claimed:
                relay.ack_outbox(m.tenant_id, m.message_id, m.claim_token)


@pytest.fixture
def owner(connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    return connect(owner=True)


def live_task(keel: Keel, tenant: uuid.UUID, workflow: Any, topic: str) -> dict[str, Any]:
    """A running task with a pending message, a reservation past its retention (still
    reserved), a completed operation past its retention (both the task's run ledger, which
    goes with the task), a completed operation of no task past its retention, two
    checkpoints of one kind (the first superseded) and an active session."""
    ledger = Keel(keel.conn, key_provider=FILL_KEY)
    task = keel.create_task(tenant, workflow.name, workflow.version)
    lease = keel.claim_lease(tenant, task.task_id, "g11", timedelta(minutes=5))
    keel.transition_task(
        tenant,
        task.task_id,
        lease.state_version,
        "running",
        fencing_token=lease.fencing_token,
        outbox=[{"topic": f"{topic}.live", "payload": {}}],
    )
    tiny = timedelta(milliseconds=1)
    reserved = keel.reserve_operation(
        tenant,
        task.task_id,
        "live-reserved",
        "call",
        "h1",
        fencing_token=lease.fencing_token,
        retention=tiny,
    )
    done = keel.reserve_operation(
        tenant,
        task.task_id,
        "live-done",
        "call",
        "h2",
        fencing_token=lease.fencing_token,
        retention=tiny,
    )
    keel.complete_operation(tenant, done.operation_id, lease.fencing_token, {"ok": True})
    free = keel.reserve_operation(tenant, None, "no-task", "call", "h3", retention=tiny)
    keel.complete_operation(tenant, free.operation_id, None, {"ok": True})
    old = ledger.save_checkpoint(tenant, task.task_id, lease.fencing_token, "PLAN", {"v": 1})
    new = ledger.save_checkpoint(tenant, task.task_id, lease.fencing_token, "PLAN", {"v": 2})
    return {
        "task": task.task_id,
        "reserved": reserved.operation_id,
        "done": done.operation_id,
        "free": free.operation_id,
        "old_checkpoint": old.checkpoint_id,
        "new_checkpoint": new.checkpoint_id,
    }


def test_the_purge_removes_what_retention_says_and_nothing_live(
    owner, keel, make_tenant, workflow, login_role
):
    """A tenant with finished tasks (delivered messages, steps, checkpoints, closed and
    open sessions, inbox rows) and one live task, every retention period set to 0; a
    neighbour with the same rows and the default periods. The purge, in steps of five
    rows, removes every finished task with all it owns, the expired operation of no task,
    the superseded checkpoint and the inbox row; the live task keeps its events, its
    pending message, its operations (expired, but its run ledger), its newest checkpoint;
    a queued task with no message stays too. The neighbour's rows are exactly as before.

    Mutation: purge_takes_live_tasks"""
    topic = f"g11.{uuid.uuid4().hex[:8]}"
    doomed, neighbour = make_tenant(), make_tenant()
    for tenant in (doomed, neighbour):
        fill_tenant(keel.conn, tenant, workflow.name, 2, topic=topic)
    deliver(login_role("keel_relay").dsn, topic)
    live = live_task(keel, doomed, workflow, topic)
    queued = keel.create_task(doomed, workflow.name, workflow.version).task_id  # no message
    with in_tenant(owner, doomed):
        events = owner.execute(
            "select seq, to_state from keel.task_events where tenant_id = %s and task_id = %s"
            " order by seq",
            (doomed, live["task"]),
        ).fetchall()
    retain_nothing(owner, doomed)
    before = tenant_snapshot(owner, neighbour)

    assert purge_all(owner, doomed, 5) > 10
    assert ids(owner, doomed, "select task_id from keel.tasks where tenant_id = %s") == {
        live["task"],
        queued,
    }
    with in_tenant(owner, doomed):
        assert (
            owner.execute(
                "select seq, to_state from keel.task_events where tenant_id = %s"
                " and task_id = %s order by seq",
                (doomed, live["task"]),
            ).fetchall()
            == events
        )
    assert ids(
        owner, doomed, "select state || ':' || task_id from keel.outbox where tenant_id = %s"
    ) == {f"pending:{live['task']}"}
    assert ids(owner, doomed, "select operation_id from keel.operations where tenant_id = %s") == {
        live["reserved"],
        live["done"],
    }
    assert ids(
        owner, doomed, "select checkpoint_id from keel.checkpoints where tenant_id = %s"
    ) == {live["new_checkpoint"]}
    for table in ("keel.inbox", "keel.step_attempts", "keel.sessions", "keel.session_updates"):
        assert ids(owner, doomed, f"select 1 from {table} where tenant_id = %s") == set(), table
    assert tenant_snapshot(owner, neighbour) == before, "another tenant's rows changed"


def test_the_purge_skips_rows_someone_holds_and_takes_them_later(
    owner, keel, make_tenant, workflow, login_role, connect
):
    """A transaction holds a lock on one finished task and on a delivered message of
    another. A purge (lock_timeout 5 s) does not wait: it removes everything else, and
    leaves the held message, its task (whose messages go first) and the held task; once
    the locks are gone, the next purge removes them.

    Mutation: purge_waits_on_locks"""
    topic = f"g11.{uuid.uuid4().hex[:8]}"
    tenant = make_tenant()
    fill_tenant(keel.conn, tenant, workflow.name, 3, topic=topic)
    deliver(login_role("keel_relay").dsn, topic)
    retain_nothing(owner, tenant)
    holder = connect(owner=True)
    with holder.transaction():
        holder.execute("select keel.use_tenant(%s)", (tenant,))
        row = holder.execute(
            "select task_id from keel.tasks where tenant_id = %s order by task_id limit 1"
            " for update",
            (tenant,),
        ).fetchone()
        assert row is not None
        held_task = row[0]
        row = holder.execute(
            "select message_id, task_id from keel.outbox where tenant_id = %s and task_id <> %s"
            " order by message_id limit 1 for update",
            (tenant, held_task),
        ).fetchone()
        assert row is not None
        held_message, its_task = row
        purge_all(owner, tenant, lock_timeout="5s")
        tasks = ids(owner, tenant, "select task_id from keel.tasks where tenant_id = %s")
        assert tasks == {held_task, its_task}
        messages = ids(owner, tenant, "select message_id from keel.outbox where tenant_id = %s")
        assert messages == {held_message}
    purge_all(owner, tenant)
    assert ids(owner, tenant, "select task_id from keel.tasks where tenant_id = %s") == set()
    assert ids(owner, tenant, "select message_id from keel.outbox where tenant_id = %s") == set()


def test_the_purge_does_not_wait_on_a_save_and_gives_its_bytes_back(
    owner, keel, make_tenant, workflow, login_role, connect
):
    """A save of the tenant holds its checkpoint-byte counter (keel.tenant_usage) to its
    commit. A purge (lock_timeout 5 s) beside such an open save does not wait on it: it
    removes every finished task with its checkpoints, and credits their bytes to the tenant
    (keel.tenant_usage_credits) without touching the counter; the tenant's quota counts
    them given back (keel.tenant_quota_status) while the save is still open and after.

    Mutation: purge_waits_on_saves"""
    topic = f"g11.{uuid.uuid4().hex[:8]}"
    tenant = make_tenant()
    fill_tenant(keel.conn, tenant, workflow.name, 3, topic=topic)
    deliver(login_role("keel_relay").dsn, topic)
    retain_nothing(owner, tenant)

    def counted() -> tuple[int, int]:
        with in_tenant(owner, tenant):
            row = owner.execute(
                "select used from keel.tenant_quota_status(%s)"
                " where setting = 'max_tenant_checkpoint_bytes'",
                (tenant,),
            ).fetchone()
            held = owner.execute(
                "select coalesce(sum(octet_length(ciphertext)), 0)"
                " from keel.checkpoint_payloads where tenant_id = %s",
                (tenant,),
            ).fetchone()
        assert row is not None and held is not None
        return int(row[0]), int(held[0])

    before, held = counted()
    assert before == held > 0
    saver = connect(owner=True)
    with saver.transaction():
        saver.execute("select keel.use_tenant(%s)", (tenant,))
        locked = saver.execute(
            "select 1 from keel.tenant_usage where tenant_id = %s for update", (tenant,)
        ).fetchall()
        assert locked, "the tenant's saves made no counter row"
        purge_all(owner, tenant, lock_timeout="5s")
        assert ids(owner, tenant, "select task_id from keel.tasks where tenant_id = %s") == set()
        assert counted() == (0, 0)
    assert counted() == (0, 0)


def test_a_purge_racing_with_transitions_claims_and_acks_loses_nothing_live(
    owner, keel, make_tenant, workflow, role_dsn, login_role
):
    """Two application logins create tasks and move them to done or leave them running,
    each with a message, while a relay acks messages and the owner purges the tenant in
    steps of seven, with every retention period 0, in a loop. At the end (one last purge),
    every task that is left has every event from 1 to its last, every task that is not
    finished is left, and every pending message is left.

    Mutation: purge_children_of_any_task"""
    topic = f"g11.{uuid.uuid4().hex[:8]}"
    tenant = make_tenant()
    retain_nothing(owner, tenant)
    relay_dsn = login_role("keel_relay").dsn
    stop = threading.Event()
    running: list[uuid.UUID] = []
    errors: list[BaseException] = []

    def work(finish: bool) -> None:
        try:
            with suite_connect(role_dsn("keel_app"), autocommit=True) as conn:
                app = Keel(conn)
                while not stop.is_set():
                    task = app.create_task(tenant, workflow.name, workflow.version)
                    lease = app.claim_lease(tenant, task.task_id, "g11", timedelta(minutes=5))
                    moved = app.transition_task(
                        tenant,
                        task.task_id,
                        lease.state_version,
                        "running",
                        fencing_token=lease.fencing_token,
                        outbox=[{"topic": topic, "payload": {}}],
                    )
                    if finish:
                        app.transition_task(
                            tenant,
                            task.task_id,
                            moved.state_version,
                            "done",
                            fencing_token=lease.fencing_token,
                        )
                    else:
                        running.append(task.task_id)
        except BaseException as err:
            errors.append(err)

    def relay() -> None:
        try:
            with suite_connect(relay_dsn, autocommit=True) as conn:
                r = Keel(conn)
                while not stop.is_set():
                    for m in r.claim_outbox("g11-race", 20, topic_prefix=topic):
                        r.ack_outbox(m.tenant_id, m.message_id, m.claim_token)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(f,)) for f in (True, False)]
    threads.append(threading.Thread(target=relay))
    for t in threads:
        t.start()
    try:
        purged = 0
        deadline = time.monotonic() + 60
        while (purged < 100 or len(running) < 5) and time.monotonic() < deadline and not errors:
            purged += purge_step(owner, tenant, 7)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    purge_all(owner, tenant, 7)
    with in_tenant(owner, tenant):
        tasks = owner.execute(
            "select t.task_id, t.last_event_seq, array_agg(e.seq order by e.seq)"
            " from keel.tasks as t left join keel.task_events as e"
            " on e.tenant_id = t.tenant_id and e.task_id = t.task_id"
            " where t.tenant_id = %s group by t.task_id, t.last_event_seq",
            (tenant,),
        ).fetchall()
        orphans = owner.execute(
            "select count(*) from keel.task_events as e where e.tenant_id = %s and not exists"
            " (select 1 from keel.tasks as t where t.tenant_id = e.tenant_id"
            " and t.task_id = e.task_id)",
            (tenant,),
        ).fetchone()
    for task_id, last, seqs in tasks:
        assert seqs == list(range(1, last + 1)), f"task {task_id} lost events: {seqs}"
    assert orphans == (0,)
    assert set(running) <= {t[0] for t in tasks}, "a task that was not finished was purged"
    if purged < 100:  # too few purges beside the writers to show anything either way
        inconclusive(f"the purge removed {purged} rows beside the writers in 60 s, not 100")


def test_only_the_owner_purges_and_bad_arguments_are_refused(owner, login_role, tenant):
    """Every application role is refused EXECUTE on keel.purge, keel.purge_tenants and
    keel.set_tenant_retention; the owner gets invalid_argument for a step size out of
    range, the nil uuid (to purge or to set a period for), a page size out of range, an
    unknown, negative or over-long (past 100 years) retention period; a period set and
    removed (null) comes back as written.

    Mutation: purge_step_unbounded"""
    calls = (
        ("select * from keel.purge(%s, 10)", (tenant,)),
        ("select * from keel.purge_tenants(null, 10)", ()),
        ("select keel.set_tenant_retention(%s, 'retain_inbox', '1 day')", (tenant,)),
    )
    for role in ("keel_app", "keel_worker", "keel_agent", "keel_relay", "keel_auditor"):
        with suite_connect(login_role(role).dsn, autocommit=True) as conn:
            for query, params in calls:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(query, params)
    for query, params in (
        ("select * from keel.purge(%s, 0)", (tenant,)),
        ("select * from keel.purge(%s, 100001)", (tenant,)),
        ("select * from keel.purge(%s, null)", (tenant,)),
        ("select * from keel.purge(%s, 10)", (uuid.UUID(int=0),)),
        ("select * from keel.purge_tenants(null, 0)", ()),
        ("select keel.set_tenant_retention(%s, 'retain_forever', '1 day')", (tenant,)),
        ("select keel.set_tenant_retention(%s, 'retain_inbox', '-1 day')", (tenant,)),
        ("select keel.set_tenant_retention(%s, 'retain_inbox', '101 years')", (tenant,)),
        ("select keel.set_tenant_retention(%s, 'retain_inbox', '1 day')", (uuid.UUID(int=0),)),
    ):
        with pytest.raises(InvalidArgument), owner.transaction():
            try:
                owner.execute(query, params)
            except psycopg.Error as err:
                raise (translate(err) or err) from err
    row = owner.execute(
        "select keel.set_tenant_retention(%s, 'retain_inbox', '2 days')", (tenant,)
    ).fetchone()
    assert row is not None and "2 days" in str(row[0])
    owner.execute("select keel.set_tenant_retention(%s, 'retain_inbox', null)", (tenant,))
    assert (
        ids(owner, tenant, "select setting from keel.tenant_retention where tenant_id = %s")
        == set()
    )
