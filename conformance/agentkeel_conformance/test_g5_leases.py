"""G5 Leases with fencing: at most one valid lease per task; every acquisition increments
the fencing token, and a stale token is refused on every fenced write."""

from __future__ import annotations

import functools
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from agentkeel.client import Keel, set_tenant_context
from agentkeel.errors import InvalidArgument, LeaseHeld, LeaseLost
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import race

pytestmark = pytest.mark.guarantee("G5")

SHORT = timedelta(milliseconds=300)


def wait_past(lease: timedelta) -> None:
    time.sleep(lease.total_seconds() + 0.2)


def test_every_acquisition_increments_the_fencing_token(keel, tenant, new_task):
    """No mutation: claim_lease's token increment has no planted bug yet."""
    task = new_task()
    tokens = []
    for owner in ("a", "b", "c"):
        claimed = keel.claim_lease(tenant, task.task_id, owner)
        tokens.append(claimed.fencing_token)
        keel.release_lease(tenant, task.task_id, claimed.fencing_token)
    assert tokens == [1, 2, 3]


def test_an_unexpired_lease_refuses_a_second_claim(keel, tenant, new_task):
    """No mutation: claim_lease's held-lease check has no planted bug yet."""
    task = new_task()
    keel.claim_lease(tenant, task.task_id, "a")
    with pytest.raises(LeaseHeld):
        keel.claim_lease(tenant, task.task_id, "b")


FENCED_WRITES = {
    "renew": lambda k, t, task, token: k.renew_lease(t, task, token),
    "release": lambda k, t, task, token: k.release_lease(t, task, token),
    "transition": lambda k, t, task, token: k.transition_task(
        t, task, 1, "running", fencing_token=token
    ),
    "reserve": lambda k, t, task, token: k.reserve_operation(
        t, task, "k2", "x", "h", fencing_token=token
    ),
}


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
def test_a_stale_token_is_refused_after_a_takeover(keel, connect, tenant, new_task, write):
    """No mutation: assert_lease has no planted bug; completion_unfenced is another path."""
    task = new_task()
    a = keel.claim_lease(tenant, task.task_id, "worker-a", SHORT)
    wait_past(SHORT)
    b = Keel(connect(role="keel_worker")).claim_next_task("worker-b", workflow=task.workflow)
    assert b is not None and b.task_id == task.task_id
    assert b.fencing_token == a.fencing_token + 1
    with pytest.raises(LeaseLost) as info:
        FENCED_WRITES[write](keel, tenant, task.task_id, a.fencing_token)
    assert info.value.sqlstate == "55K03"
    assert f"current token is {b.fencing_token}" in (info.value.detail or "")


def test_completing_an_operation_with_a_stale_token_is_refused(keel, connect, tenant, new_task):
    """Mutation: completion_unfenced."""
    task = new_task()
    a = keel.claim_lease(tenant, task.task_id, "worker-a", SHORT)
    op = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", "h", fencing_token=a.fencing_token
    )
    wait_past(SHORT)
    b = keel.claim_lease(tenant, task.task_id, "worker-b")
    with pytest.raises(LeaseLost):
        keel.complete_operation(tenant, op.operation_id, a.fencing_token, {"late": True})
    # The new holder sees the orphaned reservation and may reconcile it.
    replay = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", "h", fencing_token=b.fencing_token
    )
    assert (replay.outcome, replay.reserved_fencing_token) == ("in_progress", a.fencing_token)
    done = keel.complete_operation(tenant, op.operation_id, b.fencing_token, {"reconciled": True})
    assert done.state == "succeeded"


def test_an_expired_lease_cannot_be_renewed_even_if_nobody_took_it(keel, tenant, new_task):
    """No mutation: renew_lease's expiry check has no planted bug yet."""
    task = new_task()
    a = keel.claim_lease(tenant, task.task_id, "a", SHORT)
    wait_past(SHORT)
    with pytest.raises(LeaseLost) as info:
        keel.renew_lease(tenant, task.task_id, a.fencing_token)
    assert "expired" in (info.value.detail or "")


def test_a_leased_task_cannot_be_moved_without_its_token(keel, connect, tenant, new_task):
    """No mutation: transition_task's fencing branch has no planted bug yet."""
    task = new_task()
    keel.claim_lease(tenant, task.task_id, "a")
    with pytest.raises(LeaseLost):
        keel.transition_task(tenant, task.task_id, 1, "running")


def test_renewal_extends_and_release_makes_the_task_due_now(keel, tenant, new_task):
    """No mutation: renew_lease and release_lease have no planted bug yet."""
    task = new_task()
    a = keel.claim_lease(tenant, task.task_id, "a", timedelta(seconds=5))
    renewed = keel.renew_lease(tenant, task.task_id, a.fencing_token, timedelta(seconds=60))
    assert renewed.lease_expires_at > a.lease_expires_at
    assert renewed.wake_at == renewed.lease_expires_at
    released = keel.release_lease(tenant, task.task_id, a.fencing_token)
    assert released.lease_owner is None and released.wake_at <= released.updated_at
    assert keel.claim_lease(tenant, task.task_id, "b").fencing_token == a.fencing_token + 1


def test_two_claimers_never_get_the_same_task(connect, workflow, new_task):
    """No mutation: claim_window fails it only if claims collide: timing, not certain."""
    tasks = {new_task().task_id for _ in range(30)}  # all due now
    claimers = [Keel(connect(role="keel_worker")) for _ in range(4)]

    def drain(client: Keel) -> list[tuple[Any, int]]:
        got = []
        while (
            task := client.claim_next_task("drainer", timedelta(minutes=5), workflow.name)
        ) is not None:
            got.append((task.task_id, task.fencing_token))
        return got

    outcomes = race([functools.partial(drain, c) for c in claimers])
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    claimed = [task_id for _, got in outcomes for task_id, _ in got]
    assert len(claimed) == len(set(claimed)), "a task was leased twice"
    assert tasks <= set(claimed)


def test_nothing_due_means_no_claim(keel, worker_keel, tenant, new_task):
    """No mutation: claim_next_task's due filter has no planted bug yet."""
    task = new_task()
    keel.claim_lease(tenant, task.task_id, "a")
    assert worker_keel.claim_next_task("b", workflow=task.workflow) is None


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-1), timedelta(days=8)])
def test_lease_durations_are_validated(keel, tenant, new_task, lease):
    """No mutation: interval_compared still refuses these plain intervals."""
    task = new_task()
    with pytest.raises(InvalidArgument):
        keel.claim_lease(tenant, task.task_id, "a", lease)


def test_a_batch_claim_leases_the_oldest_due_tasks_each_with_its_own_token(
    worker_keel, connect, make_tenant, workflow
):
    """keel.claim_next_tasks: oldest first, each task once, each with its next fencing
    token; a task of one tenant leaves that tenant as the context, tasks of two none.
    No mutation: claim_window fails the concurrent batch test below; this one is order."""
    keel = worker_keel
    a, b = make_tenant(), make_tenant()
    creator = Keel(connect(role="keel_app"))
    made = [creator.create_task(t, workflow.name, workflow.version) for t in (a, b, a, b, a)]
    first = keel.claim_next_tasks("batcher", 3, timedelta(minutes=5), workflow.name)
    assert [t.task_id for t in first] == [m.task_id for m in made[:3]]
    assert all(t.fencing_token == 1 and t.lease_owner == "batcher" for t in first)
    rest = keel.claim_next_tasks("batcher", 10, timedelta(minutes=5), workflow.name)
    assert [t.task_id for t in rest] == [m.task_id for m in made[3:]]
    assert keel.claim_next_tasks("batcher", 10, workflow=workflow.name) == []
    with pytest.raises(InvalidArgument):
        keel.claim_next_tasks("batcher", 0, workflow=workflow.name)

    conn = connect(role="keel_worker")
    one, _ = (creator.create_task(t, workflow.name, workflow.version) for t in (a, b))
    with conn.transaction():
        got = conn.execute(
            "select tenant_id from keel.claim_next_tasks('w', 1, '1 minute', %s)",
            (workflow.name,),
        ).fetchall()
        assert got == [(a,)]
        assert conn.execute("select keel.current_tenant()").fetchone() == (a,)
    creator.release_lease(a, one.task_id, 1)
    with conn.transaction():
        got = conn.execute(
            "select tenant_id from keel.claim_next_tasks('w', 5, '1 minute', %s)",
            (workflow.name,),
        ).fetchall()
        assert sorted(str(r[0]) for r in got) == sorted([str(a), str(b)])
        # Tasks of two tenants: the transaction acts for none (the nil uuid).
        assert conn.execute("select keel.current_tenant()").fetchone() == (uuid.UUID(int=0),)


def test_concurrent_batch_claimers_never_share_a_task(connect, workflow, new_task):
    """Mutation: claim_window."""
    tasks = {new_task().task_id for _ in range(60)}  # all due now
    claimers = [Keel(connect(role="keel_worker")) for _ in range(4)]

    def drain(client: Keel) -> list[tuple[Any, int]]:
        got: list[tuple[Any, int]] = []
        while batch := client.claim_next_tasks(
            "batch-drainer", 7, timedelta(minutes=5), workflow.name
        ):
            got.extend((t.task_id, t.fencing_token) for t in batch)
        return got

    outcomes = race([functools.partial(drain, c) for c in claimers])
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    claimed = [task_id for _, got in outcomes for task_id, _ in got]
    assert len(claimed) == len(set(claimed)), "a task was leased twice"
    assert tasks <= set(claimed)


def claim_both(conn: psycopg.Connection, workflow: Any, a: Any, b: Any) -> None:
    """In the open transaction, claim the due tasks of tenants a and b: after it the
    transaction acts for neither."""
    got = conn.execute(
        "select tenant_id from keel.claim_next_tasks('w', 5, '1 minute', %s)",
        (workflow.name,),
    ).fetchall()
    assert {r[0] for r in got} == {a, b}


@pytest.mark.guarantee("G1")
@pytest.mark.parametrize(
    "then",
    [
        "select count(*) from keel.claim_next_tasks('w', 5, '1 minute')",
        "select count(*) from keel.recover_stale_tasks()",
    ],
    ids=["claim", "recover"],
)
def test_a_transaction_that_acts_for_none_can_take_no_more_tasks(
    connect, make_tenant, workflow, login_role, then
):
    """After a claim of tasks of two tenants the transaction acts for none of them: a
    second claim or a recovery in it is refused (42K06), on one node as on Citus.
    No mutation: the generated mutants delete each keel.refuse_acting_for_none call."""
    a, b = make_tenant(), make_tenant()
    creator = Keel(connect(role="keel_app"))
    for tenant in (a, b):
        creator.create_task(tenant, workflow.name, workflow.version)
    conn = suite_connect(login_role("keel_worker").dsn, autocommit=True)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        claim_both(conn, workflow, a, b)
        conn.execute(then)
    conn.close()
    assert info.value.sqlstate == "42K06", info.value


@pytest.mark.guarantee("G1")
def test_the_per_tenant_claim_acts_for_its_tenant_alone(connect, make_tenant, workflow, login_role):
    """keel.claim_due_task (the per-tenant step of the claim on Citus) leases a due task of
    the tenant it names, once, and leaves a transaction that had no context without one.
    In a transaction that acts for another tenant it is refused (42K06), not answered with
    no row as if the task were taken.
    No mutation: the generated mutants disable its keel.require_tenant (tests/test_mutants.py)."""
    a, b = make_tenant(), make_tenant()
    creator = Keel(connect(role="keel_app"))
    task = creator.create_task(b, workflow.name, workflow.version)
    claim = "select tenant_id, task_id from keel.claim_due_task(%s, %s, 'w', interval '1 minute')"
    conn = suite_connect(login_role("keel_worker").dsn, autocommit=True)
    with conn.transaction():
        assert conn.execute(claim, (b, task.task_id)).fetchall() == [(b, task.task_id)]
        assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
        assert conn.execute(claim, (b, task.task_id)).fetchall() == []  # leased now
    creator.release_lease(b, task.task_id, 1)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        set_tenant_context(conn, a)
        conn.execute(claim, (b, task.task_id)).fetchall()
    conn.close()
    assert info.value.sqlstate == "42K06", info.value


@pytest.mark.guarantee("G1")
def test_a_claim_keeps_one_tenant_per_transaction(connect, make_tenant, workflow, login_role):
    """In a transaction that acts for tenant A, a claim takes only A's tasks; after a claim
    of tasks of two tenants the transaction acts for neither (42K06 on the next call).
    No mutation: claim_window plants NOWAIT; this is the context filter of the same scan."""
    a, b = make_tenant(), make_tenant()
    creator = Keel(connect(role="keel_app"))
    b_task = creator.create_task(b, workflow.name, workflow.version)  # due first
    a_task = creator.create_task(a, workflow.name, workflow.version)
    # A real worker login: row-level security applies to it (not to a superuser --dsn).
    conn = suite_connect(login_role("keel_worker").dsn, autocommit=True)
    with conn.transaction():
        set_tenant_context(conn, a)  # acts for A (on Citus only a context set so, not one
        # a call adopted on its tenant's node, is the whole transaction's)
        got = conn.execute(
            "select tenant_id, task_id from keel.claim_next_tasks('w', 5, '1 minute', %s)",
            (workflow.name,),
        ).fetchall()
        assert got == [(a, a_task.task_id)]
        assert conn.execute("select keel.current_tenant()").fetchone() == (a,)
    creator.release_lease(a, a_task.task_id, 1)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        claim_both(conn, workflow, a, b)
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)
        conn.execute("select * from keel.get_task(%s, %s)", (b, b_task.task_id))
    conn.close()
    assert info.value.sqlstate == "42K06"
    # Refused as acting for none, with the way out, not as a mismatch with a tenant.
    assert "acts for none" in str(info.value), info.value
