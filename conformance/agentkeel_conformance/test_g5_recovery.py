"""G5 recovery: a task whose lease expired unreleased is taken over by the recoverer
(keel.recover_stale_tasks): the fencing token increments, so the dead worker's late writes
are refused; a RECOVERED event records it and the task is due again for claim_next_task.
Past the maximum of recovery attempts the task fails with a RECOVERY_EXHAUSTED event. A
live lease is never touched, and no tenant's locked rows keep the recoverer from another's.

Every call names a workflow private to this module, so the suite never recovers a task of
the database's own tenants (the recoverer works across tenants)."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from agentkeel.client import Keel, Task, set_tenant_context
from agentkeel.errors import LeaseLost, StaleState, TaskNotClaimable
from agentkeel.recover import Recovery, recover_once
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.fixtures import EDGES, WORKFLOW_PREFIX, Workflow
from agentkeel_conformance.harness import in_tenant, race, tenant_snapshot

pytestmark = pytest.mark.guarantee("G5")

SHORT = timedelta(milliseconds=200)


def wait_past(lease: timedelta) -> None:
    time.sleep(lease.total_seconds() + 0.15)


@pytest.fixture(scope="module")
def private_workflow(workflow_dsn: str, owner_dsn: str) -> Iterator[Callable[..., Workflow]]:
    """Define workflows only this module's tests use; removed at the end."""
    made: list[str] = []

    def _define(edges: tuple[tuple[str, str], ...] = EDGES) -> Workflow:
        wf = Workflow(f"{WORKFLOW_PREFIX}rec-{uuid.uuid4().hex[:10]}", 1)
        with suite_connect(workflow_dsn, autocommit=True) as conn:
            Keel(conn).define_workflow(wf.name, wf.version, wf.initial_state, edges)
        made.append(wf.name)
        return wf

    yield _define
    with suite_connect(owner_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute("delete from keel.workflows where workflow = %s", (name,))


@pytest.fixture
def wf(private_workflow: Callable[..., Workflow]) -> Workflow:
    return private_workflow()


def recover(conn: psycopg.Connection, wf: Workflow, **kwargs: Any) -> list[Recovery]:
    return recover_once(conn, workflow=wf.name, **kwargs)


def stale_task(keel: Keel, tenant: uuid.UUID, wf: Workflow) -> tuple[Task, Task]:
    """A task whose worker moved it to running, then died: (created, as the worker had it)."""
    task = keel.create_task(tenant, wf.name, wf.version)
    claimed = keel.claim_lease(tenant, task.task_id, "doomed-worker", SHORT)
    running = keel.transition_task(
        tenant, task.task_id, 1, "running", fencing_token=claimed.fencing_token
    )
    return task, running


def test_a_stale_task_is_taken_over_recorded_and_due_again(keel, connect, tenant, wf):
    """No mutation: one entry is spent on G3; dropping the claim_locked_task call fails it."""
    task, dead = stale_task(keel, tenant, wf)
    wait_past(SHORT)
    (row,) = recover(connect(role="keel_worker"), wf, actor="test-recoverer")
    assert (row.tenant_id, row.task_id, row.outcome) == (tenant, task.task_id, "recovered")
    assert (row.previous_owner, row.recovery_attempts) == ("doomed-worker", 1)

    after = keel.get_task(tenant, task.task_id)
    assert after is not None
    assert after.fencing_token == dead.fencing_token + 1 == row.fencing_token
    assert (after.state, after.state_version) == ("running", dead.state_version + 1)
    assert after.lease_owner is None and after.wake_at is not None
    last = keel.task_events(tenant, task.task_id)[-1]
    assert (last.event_type, last.from_state, last.to_state) == ("RECOVERED", "running", "running")
    assert (last.seq, last.state_version) == (after.last_event_seq, after.state_version)
    assert (last.fencing_token, last.claimed_actor) == (after.fencing_token, "test-recoverer")
    assert last.payload["previous_fencing_token"] == dead.fencing_token

    # The dead worker wakes up: every fenced write with its token is refused.
    with pytest.raises(LeaseLost):
        keel.renew_lease(tenant, task.task_id, dead.fencing_token)
    with pytest.raises(LeaseLost):
        keel.transition_task(
            tenant, task.task_id, dead.state_version, "done", fencing_token=dead.fencing_token
        )
    with pytest.raises(LeaseLost):
        keel.reserve_operation(
            tenant, task.task_id, "k", "call", "h", fencing_token=dead.fencing_token
        )

    # A worker that claims as it always did gets the task, and finishes it.
    worker = Keel(connect(role="keel_worker"))
    claimed = worker.claim_next_task("next-worker", workflow=wf.name)
    assert claimed is not None and claimed.task_id == task.task_id
    assert claimed.fencing_token == after.fencing_token + 1
    done = worker.transition_task(
        tenant, task.task_id, claimed.state_version, "done", fencing_token=claimed.fencing_token
    )
    assert done.state == "done"


def test_a_live_lease_is_never_recovered(keel, connect, owner_dsn, tenant, wf):
    """No mutation: dropping lock_task_to_recover's expiry filter fails it (tried by hand)."""
    task = keel.create_task(tenant, wf.name, wf.version)
    keel.claim_lease(tenant, task.task_id, "alive", timedelta(minutes=5))
    released = keel.create_task(tenant, wf.name, wf.version)  # claimed, then given back
    token = keel.claim_lease(tenant, released.task_id, "polite", SHORT).fencing_token
    keel.release_lease(tenant, released.task_id, token)
    wait_past(SHORT)
    owner = connect(owner=True)
    before = tenant_snapshot(owner, tenant)
    assert recover(connect(role="keel_worker"), wf) == []
    assert tenant_snapshot(owner, tenant) == before


@pytest.mark.guarantee("G3")
def test_a_recovered_task_refuses_a_transition_from_its_old_version(keel, connect, tenant, wf):
    """The recovery bumps the state version: a caller that decided on the version the dead
    worker saw (no lease is needed once the task is unleased) is refused as stale.
    Mutation: version_unchecked."""
    task, dead = stale_task(keel, tenant, wf)
    wait_past(SHORT)
    recover(connect(role="keel_worker"), wf)
    with pytest.raises(StaleState):
        keel.transition_task(tenant, task.task_id, dead.state_version, "done")


@pytest.mark.parametrize("declares_failed", [True, False])
def test_recovery_exhaustion_fails_the_task_with_the_event(
    keel, connect, tenant, private_workflow, declares_failed
):
    """Two recoveries are allowed; the third expiry ends the task. A workflow that declares
    the failure state (settings.recovery_failed_state, 'failed') ends in it; one that does
    not keeps its state, unleased and never due.
    No mutation: one entry is spent on G3; an unbounded recover_locked_task fails it."""
    edges = EDGES if declares_failed else (("queued", "running"), ("running", "done"))
    wf = private_workflow(edges)
    task, _ = stale_task(keel, tenant, wf)
    recoverer = connect(role="keel_worker")
    outcomes = []
    for attempt in range(3):
        wait_past(SHORT)
        (row,) = recover(recoverer, wf, max_attempts=2)
        outcomes.append((row.outcome, row.recovery_attempts))
        if attempt < 2:
            keel.claim_lease(tenant, task.task_id, f"doomed-{attempt}", SHORT)
    assert outcomes == [("recovered", 1), ("recovered", 2), ("exhausted", 2)]

    final = keel.get_task(tenant, task.task_id)
    assert final is not None
    assert final.state == ("failed" if declares_failed else "running")
    assert final.lease_owner is None and final.wake_at is None
    events = keel.task_events(tenant, task.task_id)
    assert [e.event_type for e in events[2:]] == ["RECOVERED", "RECOVERED", "RECOVERY_EXHAUSTED"]
    last = events[-1]
    assert (last.from_state, last.to_state) == ("running", final.state)
    assert last.payload["max_recovery_attempts"] == 2
    assert [e.seq for e in events] == list(range(1, len(events) + 1))

    assert Keel(connect(role="keel_worker")).claim_next_task("w", workflow=wf.name) is None
    if declares_failed:
        with pytest.raises(TaskNotClaimable):
            keel.claim_lease(tenant, task.task_id, "w")
    assert recover(recoverer, wf) == []  # an exhausted task is not recovered again


def test_the_configured_maximum_applies_when_the_caller_names_none(keel, connect, tenant, wf):
    """settings.max_recovery_attempts is read on every call: set to 0 (inside a transaction
    that is rolled back, so no other client sees it), the first expiry exhausts the task.
    No mutation: the settings lookup has no planted bug."""
    stale_task(keel, tenant, wf)
    wait_past(SHORT)
    owner = connect(owner=True)
    with owner.transaction(force_rollback=True):
        owner.execute(
            "update keel.settings set value = '0' where setting = 'max_recovery_attempts'"
        )
        (row,) = recover(owner, wf)
        assert (row.outcome, row.state) == ("exhausted", "failed")
    (row,) = recover(connect(role="keel_worker"), wf)
    assert row.outcome == "recovered"  # the stored maximum is 5


def test_a_tenant_locking_its_stale_tasks_does_not_stall_another_tenants_recovery(
    keel, connect, make_tenant, wf
):
    """Tenant A holds row locks on its stale tasks, in a transaction that stays open;
    B's stale task is recovered in the same call, A's are skipped, not waited on.
    No mutation: claim_window plants NOWAIT in claim_next_task only."""
    a, b = make_tenant(), make_tenant()
    a_tasks = [stale_task(keel, a, wf)[0] for _ in range(20)]
    b_task, _ = stale_task(keel, b, wf)
    wait_past(SHORT)
    holder = connect(owner=True)
    recoverer = connect(role="keel_worker")
    recoverer.execute("set lock_timeout = '2s'")
    with in_tenant(holder, a):
        holder.execute(
            "select 1 from keel.tasks where tenant_id = %s and task_id = any(%s) for update",
            (a, [t.task_id for t in a_tasks]),
        )
        rows = recover(recoverer, wf)
        assert [(r.tenant_id, r.task_id) for r in rows] == [(b, b_task.task_id)]
    assert len(recover(recoverer, wf)) == 20  # once the locks are gone


def test_concurrent_recoverers_never_take_the_same_task_twice(keel, connect, tenant, wf):
    """No mutation: NOWAIT in lock_task_to_recover fails it (tried by hand; not in MUTATIONS)."""
    tasks = {stale_task(keel, tenant, wf)[0].task_id for _ in range(12)}
    wait_past(SHORT)
    conns = [connect(role="keel_worker") for _ in range(3)]
    outcomes = race([functools.partial(recover, c, wf, limit=5) for c in conns])
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    rows = [r for _, batch in outcomes for r in batch] + recover(conns[0], wf)
    assert sorted(r.task_id for r in rows) == sorted(tasks), "a task was recovered twice, or missed"
    assert {(r.outcome, r.recovery_attempts) for r in rows} == {("recovered", 1)}


def test_a_worker_login_recovers_and_an_agent_login_cannot(keel, app_keel, tenant, wf, login_role):
    """No mutation: the grant is checked by `agentkeel check` (shipped_grants) as well."""
    task, _ = stale_task(keel, tenant, wf)
    wait_past(SHORT)
    token = app_keel.mint_tenant_token(tenant)
    with suite_connect(login_role("keel_agent").dsn, autocommit=True) as conn:
        Keel(conn, token).get_task(tenant, task.task_id)  # the agent may act in its tenant
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            recover(conn, wf)
    with suite_connect(login_role("keel_worker").dsn, autocommit=True) as conn:
        (row,) = recover(conn, wf)
    assert row.task_id == task.task_id
    recovered = keel.task_events(tenant, task.task_id)[-1]
    assert recovered.actor == login_role("keel_worker").name


def test_takeovers_by_claims_count_and_end_in_exhaustion(keel, connect, tenant, wf):
    """A task whose every holder dies is bounded however it is taken over: each claim of
    an expired, unreleased lease counts in recovery_attempts; at the maximum the claim no
    longer offers it, and the recoverer fails it with RECOVERY_EXHAUSTED.
    Mutation: takeovers_uncounted."""
    worker = Keel(connect(role="keel_worker"))
    row = (
        connect()
        .execute("select value::integer from keel.settings where setting = 'max_recovery_attempts'")
        .fetchone()
    )
    limit = int(row[0]) if row else 5
    task = keel.create_task(tenant, wf.name, wf.version)
    assert worker.claim_next_task("first", SHORT, wf.name) is not None  # a fresh lease
    for taken_over in range(1, limit + 1):
        wait_past(SHORT)  # the holder died: its lease expires unreleased
        claimed = worker.claim_next_task(f"next-{taken_over}", SHORT, wf.name)
        assert claimed is not None and claimed.task_id == task.task_id
        assert claimed.recovery_attempts == taken_over
    wait_past(SHORT)
    assert worker.claim_next_task("one-too-many", SHORT, wf.name) is None
    (row_,) = recover(connect(role="keel_worker"), wf)
    assert (row_.task_id, row_.outcome) == (task.task_id, "exhausted")
    assert keel.task_events(tenant, task.task_id)[-1].event_type == "RECOVERY_EXHAUSTED"


@pytest.mark.guarantee("G1")
def test_the_recoverer_never_revives_a_context_left_by_an_earlier_transaction(
    keel, make_tenant, wf, login_role
):
    """A tenant id left at session level (by an earlier client of a pooled connection) is
    not a context; after the recoverer took tasks over it must not become one.
    No mutation: session_context breaks the stamp check this relies on, not this path."""
    a, b = make_tenant(), make_tenant()
    stale_task(keel, a, wf)
    wait_past(SHORT)
    # A real worker login: row-level security applies to it (not to a superuser --dsn).
    conn = suite_connect(login_role("keel_worker").dsn, autocommit=True)
    conn.execute("select set_config('keel.tenant_id', %s, false)", (str(b),))  # a leftover
    with conn.transaction():
        assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
        (row,) = recover(conn, wf)
        assert row.tenant_id == a
        assert conn.execute("select keel.current_tenant()").fetchone() != (b,)
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)
    conn.close()


def test_a_transaction_acting_for_a_tenant_recovers_only_that_tenants_tasks(
    keel, connect, make_tenant, wf
):
    """One transaction acts for one tenant: the recoverer in a transaction whose context
    is tenant A leaves B's stale task alone, as a claim there would.
    Mutation: recover_ignores_context."""
    a, b = make_tenant(), make_tenant()
    task_a, _ = stale_task(keel, a, wf)
    task_b, _ = stale_task(keel, b, wf)
    wait_past(SHORT)
    conn = connect(role="keel_worker")
    with conn.transaction():
        set_tenant_context(conn, a)
        rows = recover(conn, wf)
    assert [(r.tenant_id, r.task_id) for r in rows] == [(a, task_a.task_id)]
    untouched = keel.get_task(b, task_b.task_id)
    assert untouched is not None and untouched.lease_owner == "doomed-worker"


def test_a_recoverer_cannot_raise_the_maximum_of_recovery_attempts(keel, connect, tenant, wf):
    """A caller may ask for fewer recoveries than settings.max_recovery_attempts, never
    more: past the setting claims no longer offer the task, and one worker's argument must
    not keep reviving a task that kills every worker taking it.
    Mutation: recover_max_raisable."""
    (limit,) = connect(role="keel_worker").execute("select keel.max_recovery_attempts()").fetchone()
    task, _ = stale_task(keel, tenant, wf)
    owner = connect(owner=True)
    with in_tenant(owner, tenant):  # as if it had been recovered that often already
        owner.execute(
            "update keel.tasks set recovery_attempts = %s where tenant_id = %s and task_id = %s",
            (limit, tenant, task.task_id),
        )
    wait_past(SHORT)
    (row,) = recover(connect(role="keel_worker"), wf, max_attempts=limit + 100)
    assert (row.task_id, row.outcome, row.recovery_attempts) == (task.task_id, "exhausted", limit)


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        ("select * from keel.recover_stale_tasks(0)", "a claim takes 1 to"),
        (
            "select * from keel.recover_stale_tasks(keel.max_batch_items() + 1)",
            "a claim takes 1 to",
        ),
        ("select * from keel.recover_stale_tasks(10, p_actor => '')", "actor"),
    ],
    ids=["no_tasks", "over_the_batch_limit", "empty_actor"],
)
def test_recover_arguments_are_checked(connect, call, problem):
    """A recovery takes 1 to settings.max_batch_items tasks, like every claim, and names
    its actor in 1 to 200 characters: anything else is invalid_argument (22K01) before a
    lease is touched.
    No mutation: the generated mutants disable each check (tests/test_mutants.py)."""
    with pytest.raises(psycopg.Error, match=problem) as info:
        connect(role="keel_worker").execute(call.encode()).fetchall()
    assert info.value.sqlstate == "22K01"
