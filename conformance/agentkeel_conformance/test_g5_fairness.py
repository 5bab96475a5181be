"""G5 fairness: no tenant can keep workers from claiming another tenant's due work,
whatever rows it locks or however it sets its own wake times; and every interval a caller
passes is checked as the timestamp it produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentkeel.client import Keel
from agentkeel.errors import InvalidArgument
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant

pytestmark = pytest.mark.guarantee("G5")

# More than any candidate window a claim might use: the old claim rescanned 16, 4 times.
LOCKED = 70


def test_a_tenant_locking_its_due_tasks_does_not_stall_another_tenants_claim(
    keel, app_keel, worker_keel, make_tenant, workflow, login_role
):
    """An agent of tenant A holds row locks on more of its due tasks than a candidate
    window, in a transaction that never goes idle; A's tasks are due before B's. A worker
    still claims B's task in one call.
    Mutation: claim_window."""
    a, b = make_tenant(), make_tenant()
    a_tasks = [keel.create_task(a, workflow.name, workflow.version) for _ in range(LOCKED)]
    b_task = keel.create_task(b, workflow.name, workflow.version)
    token = app_keel.mint_tenant_token(a)
    attacker = suite_connect(login_role("keel_agent").dsn, autocommit=True)
    try:
        attack = Keel(attacker, token)
        with attack.transaction(a):
            for task in a_tasks:  # each call locks the row until the transaction ends
                attack.transition_task(a, task.task_id, 1, "running")
            claimed = worker_keel.claim_next_task("fair-worker", workflow=workflow.name)
            assert claimed is not None, "every due task is locked? B's is not"
            assert (claimed.tenant_id, claimed.task_id) == (b, b_task.task_id)
            attacker.execute("select 1")  # the attack was live all along
    finally:
        attacker.close()


def test_unlocked_due_tasks_of_the_same_tenant_behind_locked_ones_are_claimed(
    keel, tenant, workflow, connect
):
    """Mutation: claim_window."""
    tasks = [keel.create_task(tenant, workflow.name, workflow.version) for _ in range(LOCKED + 1)]
    holder = connect(owner=True)
    with in_tenant(holder, tenant):
        holder.execute(
            "select 1 from keel.tasks where tenant_id = %s and task_id = any(%s) for update",
            (tenant, [t.task_id for t in tasks[:LOCKED]]),
        )
        claimed = Keel(connect(role="keel_worker")).claim_next_task("w", workflow=workflow.name)
        assert claimed is not None and claimed.task_id == tasks[LOCKED].task_id


FAR_PAST = "-infinity"


@pytest.mark.parametrize("wake_at", [FAR_PAST, "1970-01-01", "now() - interval '1 year'"])
def test_a_wake_time_in_the_past_is_stored_as_now(keel, tenant, workflow, connect, wake_at):
    """Mutation: wake_at_unclamped."""
    before = datetime.now(UTC) - timedelta(seconds=5)
    conn = connect()
    with Keel(conn).transaction(tenant):
        wake = conn.execute(
            f"select wake_at from keel.create_task(%s, %s, %s, p_wake_at => {_literal(wake_at)})",
            (tenant, workflow.name, workflow.version),
        ).fetchone()[0]
    assert wake >= before


def _literal(value: str) -> str:
    return value if value.startswith("now()") else f"'{value}'::timestamptz"


@pytest.mark.parametrize("call", ["create", "release", "transition"])
def test_every_wake_time_a_caller_passes_is_clamped(keel, tenant, workflow, call):
    """Mutation: wake_at_unclamped."""
    task = keel.create_task(tenant, workflow.name, workflow.version)
    past = datetime(1990, 1, 1, tzinfo=UTC)
    if call == "create":
        stored = keel.create_task(tenant, workflow.name, workflow.version, wake_at=past).wake_at
    elif call == "release":
        claimed = keel.claim_lease(tenant, task.task_id, "w")
        stored = keel.release_lease(tenant, task.task_id, claimed.fencing_token, past).wake_at
    else:
        stored = keel.transition_task(tenant, task.task_id, 1, "running", wake_at=past).wake_at
    assert stored is not None and stored > datetime.now(UTC) - timedelta(minutes=1)


@pytest.mark.parametrize("wake_at", ["infinity", "now() + interval '400 days'"])
def test_a_wake_time_past_the_maximum_is_refused(keel, tenant, workflow, connect, wake_at):
    """No mutation: wake_at_unclamped removes the lower clamp only; the cap is unplanted."""
    conn = connect()
    with pytest.raises(InvalidArgument), Keel(conn).transaction(tenant):
        conn.execute(
            f"select keel.create_task(%s, %s, %s, p_wake_at => {_literal(wake_at)})",
            (tenant, workflow.name, workflow.version),
        )


# Interval comparison counts a month as 30 days and a year as 360: these compare as one
# day (inside every cap) but end about 14 years from now, or 14 years ago.
DECADES_LONG = "1000 years -359999 days"
ENDS_BEFORE_IT_STARTS = "-1000 years 360001 days"


@pytest.mark.parametrize("lease", [DECADES_LONG, ENDS_BEFORE_IT_STARTS, "8 days", "-1 second"])
@pytest.mark.parametrize("call", ["claim_lease", "claim_next_task", "renew_lease"])
def test_lease_durations_are_checked_as_timestamps(keel, tenant, new_task, connect, call, lease):
    """Mutation: interval_compared."""
    task = new_task()
    conn = connect(role="keel_worker") if call == "claim_next_task" else connect()
    queries = {
        "claim_lease": ("select keel.claim_lease(%s, %s, 'w', %s::interval)", (task.task_id,)),
        "claim_next_task": ("select keel.claim_next_task('w', %s::interval)", ()),
        "renew_lease": ("select keel.renew_lease(%s, %s, %s, %s::interval)", (task.task_id,)),
    }
    query, extra = queries[call]
    if call == "renew_lease":
        token = keel.claim_lease(tenant, task.task_id, "w").fencing_token
        params: tuple[object, ...] = (tenant, task.task_id, token, lease)
    elif call == "claim_lease":
        params = (tenant, *extra, lease)
    else:
        params = (lease,)
    with pytest.raises(InvalidArgument), Keel(conn).transaction(tenant):
        conn.execute(query, params)


def test_the_longest_lease_allowed_is_granted(keel, tenant, new_task):
    """No mutation: a positive control at the cap; interval_compared still grants it."""
    task = new_task()
    claimed = keel.claim_lease(tenant, task.task_id, "w", timedelta(days=7))
    assert claimed.lease_expires_at is not None
