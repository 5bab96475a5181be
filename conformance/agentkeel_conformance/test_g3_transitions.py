"""G3 Guarded transitions: only the expected version and a legal edge succeed, and each
success writes exactly one event with the next sequence number in the same transaction."""

from __future__ import annotations

import itertools
import json
import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentkeel.client import Keel
from agentkeel.errors import (
    IllegalTransition,
    InvalidArgument,
    KeelError,
    StaleState,
    TaskNotClaimable,
)
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.fixtures import EDGES
from agentkeel_conformance.harness import in_tenant, race, tenant_snapshot, wait_for
from agentkeel_conformance.interleave import wait_until_blocked

pytestmark = pytest.mark.guarantee("G3")


def test_a_legal_transition_bumps_the_version_and_writes_one_event(keel, tenant, new_task):
    """No mutation: a positive control; the refusals are what planted bugs break."""
    task = new_task()
    moved = keel.transition_task(
        tenant,
        task.task_id,
        1,
        "running",
        payload={"reason": "picked"},
        actor="planner",
        policy_version="p-7",
    )
    assert (moved.state, moved.state_version, moved.last_event_seq) == ("running", 2, 2)
    events = keel.task_events(tenant, task.task_id)
    assert [(e.seq, e.from_state, e.to_state, e.state_version) for e in events] == [
        (1, None, "queued", 1),
        (2, "queued", "running", 2),
    ]
    assert (events[1].claimed_actor, events[1].policy_version, events[1].payload) == (
        "planner",
        "p-7",
        {"reason": "picked"},
    )


def test_events_name_the_login_and_keep_the_callers_label_apart(
    keel, app_keel, tenant, workflow, login_role
):
    """The actor is session_user, never the definer (keel_owner) nor what the caller says.
    Mutation: actor_from_caller."""
    agent, app = login_role("keel_agent"), login_role("keel_app")
    with suite_connect(app.dsn, autocommit=True) as conn:
        task = Keel(conn).create_task(
            tenant, workflow.name, workflow.version, actor="the-app-says-admin"
        )
    token = app_keel.mint_tenant_token(tenant)
    with suite_connect(agent.dsn, autocommit=True) as conn:
        Keel(conn, token).transition_task(tenant, task.task_id, 1, "running", actor="keel_owner")
    events = keel.task_events(tenant, task.task_id)
    assert [(e.actor, e.claimed_actor) for e in events] == [
        (app.name, "the-app-says-admin"),
        (agent.name, "keel_owner"),
    ]


def test_a_stale_version_is_refused(keel, connect, tenant, new_task):
    """Mutation: version_unchecked."""
    task = new_task()
    keel.transition_task(tenant, task.task_id, 1, "running")
    with pytest.raises(StaleState) as info:
        keel.transition_task(tenant, task.task_id, 1, "done", outbox=[{"topic": "t"}])
    assert "Expected state_version 1" in (info.value.detail or "")


@pytest.mark.parametrize("target", ["done", "waiting", "nonexistent"])
def test_an_illegal_edge_is_refused(keel, connect, tenant, new_task, target):
    """No mutation: transition_task's edge check has no planted bug yet."""
    task = new_task()  # queued: only running and cancelled are legal
    with pytest.raises(IllegalTransition):
        keel.transition_task(tenant, task.task_id, 1, target, outbox=[{"topic": "t"}])


def test_event_sequences_are_contiguous(keel, tenant, new_task):
    """No mutation: the seq assignment in transition_task has no planted bug yet."""
    task = new_task()
    version = 1
    for state in ["running"] + ["waiting", "running"] * 10 + ["done"]:
        task = keel.transition_task(tenant, task.task_id, version, state)
        version = task.state_version
    events = keel.task_events(tenant, task.task_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.state_version for e in events] == list(range(1, len(events) + 1))
    assert all(a.to_state == b.from_state for a, b in itertools.pairwise(events))
    assert task.last_event_seq == len(events) == 23


def test_outbox_messages_commit_with_the_transition(keel, connect, tenant, new_task):
    """Mutation: outbox_dropped."""
    task = new_task()
    keel.transition_task(
        tenant,
        task.task_id,
        1,
        "running",
        outbox=[
            {"topic": "task.started", "key": str(task.task_id), "payload": {"n": 1}},
            {"topic": "audit", "payload": [1, 2], "headers": {"traceparent": "x"}},
        ],
    )
    with in_tenant(connect(), tenant) as conn:
        rows = conn.execute(
            "select topic, message_key, payload, headers, event_seq, position, state"
            " from keel.outbox where tenant_id = %s order by position",
            (tenant,),
        ).fetchall()
    assert rows == [
        ("task.started", str(task.task_id), {"n": 1}, {}, 2, 1, "pending"),
        ("audit", None, [1, 2], {"traceparent": "x"}, 2, 2, "pending"),
    ]


def test_the_callers_failure_after_a_transition_propagates(connect, tenant, new_task):
    """No mutation: the rollback itself is PostgreSQL's atomicity, not shipped SQL."""
    task = new_task()
    conn = connect()
    keel = Keel(conn)
    with pytest.raises(RuntimeError), conn.transaction():
        keel.transition_task(tenant, task.task_id, 1, "running", outbox=[{"topic": "t"}])
        raise RuntimeError("the caller's transaction fails after the transition")


def test_two_transitions_from_one_version_have_one_winner(connect, tenant, new_task):
    """Mutation: version_unchecked."""
    task = new_task()
    a, b = Keel(connect()), Keel(connect())
    outcomes = race(
        [
            lambda: a.transition_task(tenant, task.task_id, 1, "running"),
            lambda: b.transition_task(tenant, task.task_id, 1, "cancelled"),
        ]
    )
    kinds = sorted(kind for kind, _ in outcomes)
    assert kinds == ["error", "ok"]
    error = next(v for kind, v in outcomes if kind == "error")
    assert isinstance(error, StaleState)
    events = a.task_events(tenant, task.task_id)
    assert [e.seq for e in events] == [1, 2]


def test_a_task_follows_the_workflow_version_it_was_created_with(
    keel, workflow_keel, tenant, workflow
):
    """No mutation: the pinned workflow version has no planted bug yet."""
    edges = [("queued", "running"), ("queued", "done"), ("running", "done")]
    workflow_keel.define_workflow(workflow.name, 2, "queued", edges)
    old = keel.create_task(tenant, workflow.name, 1)
    new = keel.create_task(tenant, workflow.name, 2)
    with pytest.raises(IllegalTransition):
        keel.transition_task(tenant, old.task_id, 1, "done")
    assert keel.transition_task(tenant, new.task_id, 1, "done").state == "done"


def test_a_terminal_state_ends_the_lease_and_the_schedule(keel, tenant, new_task):
    """No mutation: transition_task's terminal branch has no planted bug yet."""
    task = new_task()
    claimed = keel.claim_lease(tenant, task.task_id, "w")
    running = keel.transition_task(
        tenant, task.task_id, 1, "running", fencing_token=claimed.fencing_token
    )
    assert running.lease_owner == "w" and running.wake_at == claimed.lease_expires_at
    done = keel.transition_task(
        tenant, task.task_id, 2, "done", fencing_token=claimed.fencing_token
    )
    assert (done.lease_owner, done.lease_expires_at, done.wake_at) == (None, None, None)
    with pytest.raises(TaskNotClaimable):
        keel.claim_lease(tenant, task.task_id, "w2")


@pytest.mark.parametrize(
    "outbox",
    [[{"no_topic": 1}], [{"topic": 5}], ["just a string"], [{"topic": "t", "headers": []}]],
)
def test_malformed_outbox_messages_are_refused(keel, connect, tenant, new_task, outbox):
    """No mutation: transition_task's outbox shape check has no planted bug yet."""
    task = new_task()
    with pytest.raises(InvalidArgument):
        keel.transition_task(tenant, task.task_id, 1, "running", outbox=outbox)


def test_a_task_created_in_a_terminal_state_is_never_due(keel, workflow_keel, tenant, workflow):
    """An initial state with no edge out is terminal (keel.workflow_states): the task is
    finished at birth, so no worker leases a task that could never move.
    Mutation: born_due."""
    workflow_keel.define_workflow(workflow.name, 10, "noted", [])
    task = keel.create_task(tenant, workflow.name, 10)
    assert (task.state, task.wake_at) == ("noted", None)
    with pytest.raises(TaskNotClaimable):
        keel.claim_lease(tenant, task.task_id, "w")


def test_declared_terminal_states_are_stored_once(workflow_keel, connect, workflow):
    """define_workflow stores which states are terminal; what transition_task, create_task
    and claim_lease read (born_due and the terminal-lease test cover those readers).
    No mutation: a catalog row read directly."""
    edges = [("queued", "running"), ("running", "queued"), ("running", "done")]
    assert workflow_keel.define_workflow(
        workflow.name, 11, "queued", edges, terminal_states=["done"]
    )
    assert workflow_keel.define_workflow(workflow.name, 11, "queued", edges) is False  # identical
    rows = connect().execute(
        "select state, terminal from keel.workflow_states"
        " where workflow = %s and workflow_version = 11 order by state",
        (workflow.name,),
    )
    assert rows.fetchall() == [("done", True), ("queued", False), ("running", False)]


BAD_WORKFLOWS = {
    "unreachable": ("queued", [("queued", "done"), ("orphan", "done")], None),
    "dead end": (
        "queued",
        [("queued", "running"), ("running", "stuck"), ("running", "done")],
        ["done"],
    ),
    "not a state": ("queued", [("queued", "done")], ["done", "nowhere"]),
    "outgoing edge": ("queued", [("queued", "done")], ["queued", "done"]),
}


@pytest.mark.parametrize("problem", sorted(BAD_WORKFLOWS))
def test_define_workflow_refuses_unreachable_and_dead_end_states(
    workflow_keel, connect, workflow, problem
):
    """A state no task can reach, or a non-terminal state no task can leave, is a broken
    workflow: refused before any task is pinned to it.
    Mutation: unreachable_states (the unreachable case; the others share its guard shape)."""
    initial, edges, terminal = BAD_WORKFLOWS[problem]
    version = 20 + sorted(BAD_WORKFLOWS).index(problem)
    with pytest.raises(InvalidArgument, match=problem):
        workflow_keel.define_workflow(
            workflow.name, version, initial, edges, terminal_states=terminal
        )
    stored = connect().execute(
        "select count(*) from keel.workflows where workflow = %s and workflow_version = %s",
        (workflow.name, version),
    )
    assert stored.fetchone() == (0,)


def test_a_batch_keeps_each_items_guarantees_and_isolates_its_refusals(keel, tenant, new_task):
    """keel.transition_tasks: a stale item, an illegal edge and a leased task moved without
    its token are refused with the single call's SQLSTATE and write nothing; the items
    around them move, each with exactly one event.
    Mutation: version_unchecked."""
    moved, stale, illegal, leased, after = (new_task() for _ in range(5))
    keel.transition_task(tenant, stale.task_id, 1, "running")  # now at version 2
    keel.claim_lease(tenant, leased.task_id, "holder")
    history = {t.task_id: keel.task_events(tenant, t.task_id) for t in (stale, illegal, leased)}
    outcomes = keel.transition_tasks(
        tenant,
        [
            {"task_id": moved.task_id, "expected_version": 1, "to_state": "running",
             "outbox": [{"topic": "batch.moved"}]},
            {"task_id": stale.task_id, "expected_version": 1, "to_state": "done",
             "outbox": [{"topic": "batch.stale"}]},
            {"task_id": illegal.task_id, "expected_version": 1, "to_state": "done"},
            {"task_id": leased.task_id, "expected_version": 1, "to_state": "running"},
            {"task_id": after.task_id, "expected_version": 1, "to_state": "cancelled"},
        ],
    )  # fmt: skip
    refused = {o.task_id: o.refused.sqlstate for o in outcomes if o.refused is not None}
    assert refused == {
        stale.task_id: "55K01",
        illegal.task_id: "55K02",
        leased.task_id: "55K03",
    }
    assert [(o.item, o.state, o.state_version) for o in outcomes if o.refused is None] == [
        (1, "running", 2),
        (5, "cancelled", 2),
    ]
    for task_id, events in history.items():  # a refused item wrote no event
        assert keel.task_events(tenant, task_id) == events
    assert keel.get_task(tenant, leased.task_id).state_version == 1
    assert keel.task_events(tenant, moved.task_id)[-1].to_state == "running"
    with keel.transaction(tenant) as conn:
        topics = conn.execute(
            "select topic from keel.outbox where tenant_id = %s", (tenant,)
        ).fetchall()
    assert topics == [("batch.moved",)]


def test_a_task_another_transaction_holds_refuses_only_its_item(keel, connect, tenant, new_task):
    """A transaction holds one task's row (it moved the task and has not committed). A
    batch that names that task and another, with a lock timeout of its own, gets the held
    item refused with lock_not_available (55P03), as the single call would be, and the
    other item moved: the batch does not fail whole (its own wait for the held row times
    out, then the single call's for that item does).
    Both tasks wake tomorrow: a due task may be locked for a while by a concurrent claim
    of every tenant's tasks (another test's, under a loaded machine longer than the lock
    timeout), and only the test's own transaction may hold these rows.
    Mutation: batch_wait_fails_whole."""
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    held, free = new_task(wake_at=tomorrow), new_task(wake_at=tomorrow)
    holder = Keel(connect())
    with holder.transaction(tenant):
        holder.transition_task(tenant, held.task_id, 1, "running")
        with keel.transaction(tenant) as conn:
            conn.execute("set local lock_timeout = '1s'")  # SET LOCAL: Citus propagates it
            rows = conn.execute(
                "select item, refused_sqlstate, state, refused_message"
                " from keel.transition_tasks(%s, %s::jsonb)",
                (
                    tenant,
                    json.dumps(
                        [
                            {
                                "task_id": str(t.task_id),
                                "expected_version": 1,
                                "to_state": "running",
                            }
                            for t in (held, free)
                        ]
                    ),
                ),
            ).fetchall()
    assert [r[:3] for r in rows] == [(1, "55P03", None), (2, None, "running")], rows


def test_two_batches_of_the_same_tasks_never_deadlock(
    keel, connect, tenant, new_task, direct_connection
):
    """Two batches name the same five tasks while other transactions hold two of them
    (they moved them, uncommitted) and let go one after the other. The batches lock their
    rows in the same order, so one waits for the other and neither meets a deadlock
    (40P01): the first writes what it can, the second finds every task moved (55K01).
    Before, the first skipped the held rows and the second locked one the first then
    waited for: each of their items went the single way through a deadlock.
    Mutation: batch_locks_skipping."""
    tasks = sorted((new_task() for _ in range(5)), key=lambda t: t.task_id)
    u1, u2 = tasks[2], tasks[4]  # held: one in the middle of the order, one at its end
    items = json.dumps(
        [{"task_id": str(t.task_id), "expected_version": 1, "to_state": "running"} for t in tasks]
    )
    control = connect()
    h1, h2 = Keel(connect()), Keel(connect())
    x, y = Keel(connect()), Keel(connect())

    def batch(client: Keel) -> list[tuple[Any, ...]]:
        with client.transaction(tenant) as conn:
            return conn.execute(
                "select item, refused_sqlstate from keel.transition_tasks(%s, %s::jsonb)",
                (tenant, items),
            ).fetchall()

    with ThreadPoolExecutor(2) as pool:
        with h1.transaction(tenant):
            h1.transition_task(tenant, u1.task_id, 1, "running")
            with h2.transaction(tenant):
                h2.transition_task(tenant, u2.task_id, 1, "running")
                first = pool.submit(batch, x)
                wait_until_blocked(control, x.conn, [h1.conn, h2.conn], first, "the first batch")
            second = pool.submit(batch, y)
            wait_until_blocked(control, y.conn, [x.conn, h1.conn], second, "the second batch")
        outcomes = {"first": first.result(timeout=120), "second": second.result(timeout=120)}
    assert all(state != "40P01" for rows in outcomes.values() for _, state in rows), outcomes
    assert outcomes["first"] == [(1, None), (2, None), (3, "55K01"), (4, None), (5, "55K01")]
    assert outcomes["second"] == [(n, "55K01") for n in range(1, 6)]


MALFORMED_BATCHES = {
    "not_an_array": '{"task_id": "%(task)s", "expected_version": 1, "to_state": "running"}',
    "bad_uuid": '[%(ok)s, {"task_id": "not-a-uuid", "expected_version": 1, "to_state": "running"}]',
    "missing_member": '[%(ok)s, {"expected_version": 1, "to_state": "running"}]',
    "null_member": '[%(ok)s, {"task_id": null, "expected_version": 1, "to_state": "running"}]',
    "not_an_object": "[%(ok)s, 7]",
}


@pytest.mark.parametrize("shape", sorted(MALFORMED_BATCHES))
def test_a_malformed_batch_is_refused_whole(keel, connect, tenant, new_task, shape):
    """A batch whose items cannot all be read runs none of them, not even the good one.
    No mutation: check_batch has no planted bug yet."""
    task = new_task()
    ok = f'{{"task_id": "{task.task_id}", "expected_version": 1, "to_state": "running"}}'
    batch = MALFORMED_BATCHES[shape] % {"task": task.task_id, "ok": ok}
    before = tenant_snapshot(connect(owner=True), tenant)  # the owner reads every table
    with pytest.raises(InvalidArgument), keel.transaction(tenant) as conn:
        conn.execute("select * from keel.transition_tasks(%s, %s::jsonb)", (tenant, batch))
    assert tenant_snapshot(connect(owner=True), tenant) == before


MALFORMED_TRANSITIONS = {
    "no_expected_version": ("null", "'running'", "'{}'", "'[]'"),
    "no_target_state": ("1", "null", "'{}'", "'[]'"),
    "payload_not_an_object": ("1", "'running'", "'[1]'", "'[]'"),
    "outbox_not_an_array": ("1", "'running'", "'{}'", """'{"topic": "t"}'"""),
    "message_without_topic": ("1", "'running'", "'{}'", """'[{"key": "k"}]'"""),
}


@pytest.mark.parametrize("shape", sorted(MALFORMED_TRANSITIONS))
def test_a_malformed_transition_is_refused_as_invalid_and_writes_nothing(
    keel, connect, tenant, new_task, shape
):
    """A transition without its expected version or target state, with a payload that is
    not an object, or an outbox that is not an array of messages with a topic, is refused
    as invalid_argument (22K01) and writes nothing: not refused later for another reason,
    not stored with a null the history cannot explain.
    No mutation: the generated mutants disable each of these checks (tests/test_mutants.py)."""
    task = new_task()
    version, to_state, payload, outbox = MALFORMED_TRANSITIONS[shape]
    before = tenant_snapshot(connect(owner=True), tenant)
    with pytest.raises(InvalidArgument), keel.transaction(tenant) as conn:
        conn.execute(
            f"select keel.transition_task(%s, %s, {version}, {to_state},"
            f" p_payload => {payload}::jsonb, p_outbox => {outbox}::jsonb)".encode(),
            (tenant, task.task_id),
        )
    assert tenant_snapshot(connect(owner=True), tenant) == before


def test_a_batch_over_the_byte_budget_is_refused_whole(keel, connect, tenant, new_task):
    """A batch of items each within the payload limit but together over
    settings.max_batch_bytes runs none of them: the database checks and writes no more
    than the budget in one call, whatever the item count allows.
    Mutation: batch_bytes_unchecked."""
    conn = connect()
    budget = int(
        conn.execute(
            "select value from keel.settings where setting = 'max_batch_bytes'"
        ).fetchone()[0]
    )
    item_limit = int(
        conn.execute(
            "select value from keel.settings where setting = 'max_event_payload_bytes'"
        ).fetchone()[0]
    )
    blob = "x" * (item_limit // 2)
    count = budget // len(blob) + 2
    task = new_task()
    items = [
        {
            "task_id": task.task_id,
            "expected_version": 1,
            "to_state": "running",
            "payload": {"b": blob},
        }
        for _ in range(count)
    ]
    before = tenant_snapshot(connect(owner=True), tenant)
    with pytest.raises(InvalidArgument) as info:
        keel.transition_tasks(tenant, items)
    assert "max_batch_bytes" in (info.value.hint or "")
    assert tenant_snapshot(connect(owner=True), tenant) == before


def test_a_missing_task_is_refused_before_its_payload_is_read(keel, tenant):
    """An item naming a task the tenant does not have is refused as task_not_found even
    when its payload would be refused too: the lookup comes first, so a batch of large
    payloads for tasks that do not exist costs a lookup each, not a walk of each payload.
    Mutation: payload_before_lookup."""
    missing = uuid.uuid4()
    [outcome] = keel.transition_tasks(
        tenant,
        [
            {
                "task_id": missing,
                "expected_version": 1,
                "to_state": "running",
                "payload": {"password": "x"},
            }
        ],
    )
    assert outcome.refused is not None
    assert outcome.refused.sqlstate == "42K04", outcome.refused


# The states of the suite's workflow, and how a task reaches each from queued.
PATHS = {
    "queued": [],
    "running": ["running"],
    "waiting": ["running", "waiting"],
    "done": ["running", "done"],
}
TARGETS = ("queued", "running", "waiting", "done", "failed", "cancelled", "nowhere")


def batch_setup(
    keel: Keel, tenant: uuid.UUID, workflow: Any, plan: list[tuple[str, str]]
) -> list[Any]:
    """A task per (state, lease) of the plan: moved to the state, then claimed (a live
    lease), claimed for 50 ms (expired soon), claimed and released (an old token, no
    lease) or left alone."""
    tasks = []
    for state, lease in plan:
        task = keel.create_task(tenant, workflow.name, workflow.version)
        for to_state in PATHS[state]:
            task = keel.transition_task(tenant, task.task_id, task.state_version, to_state)
        if lease != "none" and state != "done":
            duration = timedelta(milliseconds=50) if lease == "expired" else None
            task = keel.claim_lease(tenant, task.task_id, "batch-holder", duration)
            if lease == "released":
                task = keel.release_lease(tenant, task.task_id, task.fencing_token)
        tasks.append(task)
    return tasks


def batch_items(rng: random.Random, tasks: list[Any]) -> list[dict[str, Any]]:
    """Items over the tasks (a task may be named twice): mostly what a worker sends to
    finish what it claimed (a legal edge, the right version and token), and each of those
    wrong now and then; some with fields that only the single call writes."""
    slots = [n for n in range(len(tasks)) if rng.random() < 0.9]
    slots += rng.sample(range(len(tasks)), 2) if rng.random() < 0.3 else []
    rng.shuffle(slots)
    items = []
    for slot in slots:
        task = tasks[slot]
        legal = [to for source, to in EDGES if source == task.state]
        item: dict[str, Any] = {
            "slot": slot,
            "expected_version": task.state_version - (1 if rng.random() < 0.15 else 0),
            "to_state": rng.choice(legal) if legal and rng.random() < 0.75 else rng.choice(TARGETS),
        }
        leased = task.lease_owner is not None
        token = rng.choices(["right", "none", "wrong"], [70, 15, 15] if leased else [15, 70, 15])[0]
        if token == "right" and task.fencing_token > 0:
            item["fencing_token"] = task.fencing_token
        elif token == "wrong":
            item["fencing_token"] = task.fencing_token + 7
        for field, value, chance in (
            ("current_step", f"step-{rng.randrange(3)}", 0.2),
            ("actor", "batcher", 0.2),
            ("event_type", "moved.by_batch", 0.2),
            ("policy_version", "p-2", 0.2),
            ("release_lease", rng.random() < 0.5, 0.3),
            ("payload", {"n": rng.randrange(9)}, 0.08),
            ("outbox", [{"topic": "batch.diff"}], 0.08),
        ):
            if rng.random() < chance:
                item[field] = value
        items.append(item)
    return items


def batch_shape(keel: Keel, tenant: uuid.UUID, task: Any) -> tuple[Any, ...]:
    """What a task and its history are, apart from ids and times."""
    row = keel.get_task(tenant, task.task_id)
    assert row is not None
    wake = (
        "none" if row.wake_at is None
        else "lease" if row.wake_at == row.lease_expires_at
        else "due" if row.wake_at <= row.updated_at
        else "later"
    )  # fmt: skip
    events = [
        (e.seq, e.event_type, e.from_state, e.to_state, e.state_version, e.claimed_actor,
         e.policy_version, e.fencing_token, e.payload)
        for e in keel.task_events(tenant, task.task_id)
    ]  # fmt: skip
    return (
        row.state, row.state_version, row.last_event_seq, row.current_step, row.lease_owner,
        row.fencing_token, row.lease_expires_at is None, wake, events,
    )  # fmt: skip


def test_a_batch_decides_every_item_as_the_single_calls_would(keel, make_tenant, workflow):
    """Differential: batches of random items (right and wrong versions, tokens and edges,
    live and released leases, a task named twice, terminal targets, released leases, extra
    fields) go to keel.transition_tasks in one tenant, and the same items one by one to
    keel.transition_task in another tenant that holds the same tasks. Every item has the
    same outcome (its SQLSTATE, or its new state, version and token), and every task ends
    with the same row and the same history, apart from ids and times. The batch writes the
    plain items that pass every check in one statement; this holds that path to the single
    call's every decision.
    Mutation: batch_lease_unchecked."""
    rng = random.Random(20261205)
    # First every case once, in the shape the batch writes together: a lease kept, ended
    # by a terminal state, released; a wrong token, none, a stale version; no lease and no
    # token; a released lease's old token; illegal edges. Then random batches.
    catalog = [("running", "live")] * 6 + [
        ("queued", "none"), ("queued", "released"), ("waiting", "live"), ("done", "none"),
        ("running", "expired"),
    ]  # fmt: skip
    cases: list[tuple[str, int, str]] = [  # (token, version offset, target)
        ("right", 0, "waiting"), ("right", 0, "done"), ("release", 0, "waiting"),
        ("wrong", 0, "waiting"), ("none", 0, "waiting"), ("right", -1, "waiting"),
        ("none", 0, "running"), ("right", 0, "running"), ("right", 0, "done"),
        ("none", 0, "running"), ("right", 0, "waiting"),
    ]  # fmt: skip
    for round_ in range(11):
        plan = catalog if round_ == 0 else [
            (rng.choice(list(PATHS)), rng.choice(["none", "live", "released"])) for _ in range(10)
        ]  # fmt: skip
        batched_tenant, single_tenant = make_tenant(), make_tenant()
        batched = batch_setup(keel, batched_tenant, workflow, plan)
        single = batch_setup(keel, single_tenant, workflow, plan)
        if round_ == 0:
            items = [
                {
                    "slot": slot,
                    "expected_version": batched[slot].state_version + offset,
                    "to_state": target,
                    **({"release_lease": True} if token == "release" else {}),
                    **(
                        {"fencing_token": batched[slot].fencing_token}
                        if token in ("right", "release")
                        else {"fencing_token": batched[slot].fencing_token + 7}
                        if token == "wrong"
                        else {}
                    ),
                }
                for slot, (token, offset, target) in enumerate(cases)
            ]
            last = max(
                t.lease_expires_at
                for tasks in (batched, single)
                for t, (_, lease) in zip(tasks, plan, strict=True)
                if lease == "expired"
            )

            def expired(last: Any = last) -> bool:
                row = keel.conn.execute("select now() > %s", (last,)).fetchone()
                return row is not None and bool(row[0])

            wait_for(expired, "the 50 ms leases to expire")
        else:
            items = batch_items(rng, batched)

        def named(tasks: list[Any], item: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in item.items() if k != "slot"} | {
                "task_id": tasks[item["slot"]].task_id
            }

        outcomes = keel.transition_tasks(batched_tenant, [named(batched, i) for i in items])
        got = [
            (o.refused.sqlstate, None, None, None) if o.refused is not None
            else (None, o.state, o.state_version, o.fencing_token)
            for o in outcomes
        ]  # fmt: skip
        expected: list[tuple[Any, ...]] = []
        for item in items:
            call = named(single, item)
            try:
                moved = keel.transition_task(
                    single_tenant,
                    call.pop("task_id"),
                    call.pop("expected_version"),
                    call.pop("to_state"),
                    **call,
                )
                expected.append((None, moved.state, moved.state_version, moved.fencing_token))
            except KeelError as refused:
                expected.append((refused.sqlstate, None, None, None))
        assert got == expected, items
        for a, b in zip(batched, single, strict=True):
            assert batch_shape(keel, batched_tenant, a) == batch_shape(keel, single_tenant, b), (
                items
            )
