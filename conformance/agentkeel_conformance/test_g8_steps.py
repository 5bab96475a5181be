"""G8 Durable step reuse: a completed step with the same (task, step_key, input_hash)
returns its stored result without re-running, and records that it was reused.

A step is the operation keyed keel.step_operation_key(task, step_key) (G2): another input
hash for the same step raises idempotency_conflict; completing it is fenced (G5).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from agentkeel.checkpoints import DEFAULT_KEY_VARIABLE, StaticKeyProvider
from agentkeel.client import Keel
from agentkeel.errors import (
    IdempotencyConflict,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    PayloadRejected,
    TaskNotFound,
    TenantContextMismatch,
)
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import tenant_snapshot, wait_for

pytestmark = pytest.mark.guarantee("G8")


# Short enough to wait out, long enough that two calls fit in it on a busy machine.
SHORT_LEASE = timedelta(seconds=3)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def leased(keel, tenant, new_task):
    """A task leased by this test: (task id, fencing token)."""
    task = new_task()
    claimed = keel.claim_lease(tenant, task.task_id, "worker-a", timedelta(minutes=5))
    return task.task_id, claimed.fencing_token


class Provider:
    """Counts real executions of a step's work."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> dict[str, str]:
        self.calls += 1
        return {"summary": text.upper()}


def run_step(keel, tenant, task_id, token, step_key, text, provider):
    start = keel.begin_step(tenant, task_id, step_key, digest(text), token)
    if start.outcome == "reused":
        return start, start.result
    assert start.outcome == "started", start
    result = provider(text)
    keel.complete_step(tenant, task_id, step_key, token, result)
    return start, result


def test_a_completed_step_with_the_same_input_is_reused_not_run_again(keel, tenant, leased):
    """The second run returns the stored result, the provider is not called again, and
    one STEP_RESULT_REUSED event is appended without changing the task's state or version.

    Mutation: reuse_unrecorded"""
    task_id, token = leased
    provider = Provider()
    first, result = run_step(keel, tenant, task_id, token, "summarize", "hello", provider)
    before = keel.get_task(tenant, task_id)
    second, reused = run_step(keel, tenant, task_id, token, "summarize", "hello", provider)
    after = keel.get_task(tenant, task_id)

    assert provider.calls == 1
    assert (first.outcome, first.attempt) == ("started", 1)
    assert (second.outcome, second.operation_id, reused) == ("reused", first.operation_id, result)
    events = keel.task_events(tenant, task_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    last = events[-1]
    assert last.event_type == "STEP_RESULT_REUSED"
    assert last.payload["step_key"] == "summarize"
    assert last.payload["input_hash"] == digest("hello")
    assert last.fencing_token == token
    # Not a state change: same state, same version, so no concurrent writer goes stale.
    assert (last.from_state, last.to_state) == (before.state, before.state)
    assert last.state_version == before.state_version == after.state_version
    assert after.last_event_seq == before.last_event_seq + 1
    attempts = keel.list_step_attempts(tenant, task_id)
    assert [(a.step_key, a.attempt, a.status) for a in attempts] == [("summarize", 1, "succeeded")]


@pytest.mark.guarantee("G2")
def test_a_different_input_hash_for_a_completed_step_conflicts_and_changes_nothing(
    connect, keel, tenant, leased
):
    """Steps follow G2's rule for reused keys: new input needs a new step key.

    Mutation: hash_unchecked"""
    task_id, token = leased
    provider = Provider()
    run_step(keel, tenant, task_id, token, "summarize", "hello", provider)
    owner = connect(owner=True)
    before = tenant_snapshot(owner, tenant)
    with pytest.raises(IdempotencyConflict) as caught:
        keel.begin_step(tenant, task_id, "summarize", digest("goodbye"), token)
    assert "input_hash" in (caught.value.detail or "")
    assert tenant_snapshot(owner, tenant) == before
    assert provider.calls == 1


def take_over(keel, tenant, task_id):
    """worker-b's lease on the task, claimed once the first (SHORT_LEASE) has expired."""

    def claim():
        try:
            return keel.claim_lease(tenant, task_id, "worker-b", timedelta(minutes=5))
        except LeaseHeld:
            return None  # the first lease is still valid

    return wait_for(claim, "the first lease to expire and worker-b to claim the task")


@pytest.mark.guarantee("G5")
def test_a_stale_token_cannot_begin_or_complete_a_step(keel, tenant, new_task):
    """After a takeover the old lease holder's token is refused on every step write, and
    the new holder closes the abandoned attempt and opens the next one.

    Mutation: completion_unfenced"""
    task = new_task()
    old = keel.claim_lease(tenant, task.task_id, "worker-a", SHORT_LEASE)
    started = keel.begin_step(tenant, task.task_id, "call", digest("x"), old.fencing_token)
    assert started.outcome == "started"

    new = take_over(keel, tenant, task.task_id)

    with pytest.raises(LeaseLost):
        keel.complete_step(tenant, task.task_id, "call", old.fencing_token, {"late": True})
    with pytest.raises(LeaseLost):
        keel.fail_step(tenant, task.task_id, "call", old.fencing_token, {"late": True})
    with pytest.raises(LeaseLost):
        keel.begin_step(tenant, task.task_id, "call", digest("x"), old.fencing_token)

    resumed = keel.begin_step(tenant, task.task_id, "call", digest("x"), new.fencing_token)
    assert (resumed.outcome, resumed.attempt) == ("started", 2)
    keel.complete_step(tenant, task.task_id, "call", new.fencing_token, {"ok": True})
    attempts = keel.list_step_attempts(tenant, task.task_id)
    assert [(a.attempt, a.status, a.fencing_token) for a in attempts] == [
        (1, "abandoned", old.fencing_token),
        (2, "succeeded", new.fencing_token),
    ]


def test_a_lost_lease_begins_no_step_not_even_one_waiting_to_retry(keel, tenant, new_task):
    """A step waiting out its retry answers retry_later only to the lease holder: after a
    takeover the old token gets lease_lost there too, so a worker that lost its lease
    learns it at its next call, whatever state the step is in.
    No mutation: the generated mutants disable begin_step's lease check (tests/test_mutants.py)."""
    task = new_task()
    old = keel.claim_lease(tenant, task.task_id, "worker-a", SHORT_LEASE)
    assert keel.begin_step(
        tenant, task.task_id, "call", digest("x"), old.fencing_token
    ).outcome == ("started")
    keel.fail_step(
        tenant, task.task_id, "call", old.fencing_token, {"code": "busy"},
        retryable=True, retry_after=timedelta(minutes=10),
    )  # fmt: skip

    new = take_over(keel, tenant, task.task_id)
    with pytest.raises(LeaseLost):
        keel.begin_step(tenant, task.task_id, "call", digest("x"), old.fencing_token)
    waiting = keel.begin_step(tenant, task.task_id, "call", digest("x"), new.fencing_token)
    assert waiting.outcome == "retry_later"


@pytest.mark.parametrize("step_key", ["", "k" * 201])
def test_a_step_key_of_no_or_too_many_characters_is_refused(keel, tenant, leased, step_key):
    """A step key is 1 to 200 characters: refused as invalid_argument (22K01), nothing
    reserved, not stored under a key the worker cannot name again.
    No mutation: the generated mutants disable this check (tests/test_mutants.py)."""
    task_id, token = leased
    with pytest.raises(InvalidArgument, match="step key"):
        keel.begin_step(tenant, task_id, step_key, digest("x"), token)
    assert keel.list_step_attempts(tenant, task_id) == []


def test_a_step_without_a_task_is_refused(keel, tenant, leased):
    """A step belongs to a task: one named without it is invalid_argument (22K01), not a
    missing task (42K04) the worker would look for.
    No mutation: the generated mutants disable this check (tests/test_mutants.py)."""
    _, token = leased
    with pytest.raises(InvalidArgument, match="task id is required"):
        keel.begin_step(tenant, None, "call", digest("x"), token)


def test_a_retryable_failure_waits_then_opens_the_next_attempt(keel, tenant, leased):
    """fail_step(retryable, retry_after) holds the step until then; a final failure is
    returned as stored, never run again.

    No mutation: the retry schedule has no planted bug; reuse is covered above"""
    task_id, token = leased
    keel.begin_step(tenant, task_id, "flaky", digest("x"), token)
    failed = keel.fail_step(
        tenant, task_id, "flaky", token, {"code": "rate_limited"},
        retryable=True, retry_after=SHORT_LEASE, repairs=2,
    )  # fmt: skip
    assert (failed.status, failed.retryable, failed.repair_count) == ("failed", True, 2)
    early = keel.begin_step(tenant, task_id, "flaky", digest("x"), token)
    assert (early.outcome, early.attempt, early.error) == (
        "retry_later",
        1,
        {"code": "rate_limited"},
    )
    assert early.next_retry_at == failed.next_retry_at

    def begun():
        step = keel.begin_step(tenant, task_id, "flaky", digest("x"), token)
        return None if step.outcome == "retry_later" else step  # retry_later writes nothing

    again = wait_for(begun, "next_retry_at to pass")
    assert (again.outcome, again.attempt) == ("started", 2)
    keel.fail_step(tenant, task_id, "flaky", token, {"code": "invalid_request"})
    final = keel.begin_step(tenant, task_id, "flaky", digest("x"), token)
    assert (final.outcome, final.error) == ("failed", {"code": "invalid_request"})


@pytest.mark.guarantee("G9")
def test_step_results_and_errors_pass_the_payload_check(connect, keel, tenant, leased):
    """A step result or error carrying a secret-bearing key is refused; nothing changes.

    Mutation: result_unchecked"""
    task_id, token = leased
    keel.begin_step(tenant, task_id, "login", digest("x"), token)
    owner = connect(owner=True)
    before = tenant_snapshot(owner, tenant)
    with pytest.raises(PayloadRejected):
        keel.complete_step(tenant, task_id, "login", token, {"session": {"api_key": "sk-1"}})
    with pytest.raises(PayloadRejected):
        keel.fail_step(tenant, task_id, "login", token, {"request": {"password": "hunter2"}})
    assert tenant_snapshot(owner, tenant) == before


def counted(counter: Path) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def start_agent(dsn, key, tenant, task_id, counter, owner, pause_after=0):
    """The scripted agent in its own process; the checkpoint key in its environment."""
    env = {**os.environ, "AGENTKEEL_DSN": dsn, DEFAULT_KEY_VARIABLE: key}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentkeel_conformance.ledger_agent",
            "--tenant",
            str(tenant),
            "--task",
            str(task_id),
            "--counter",
            str(counter),
            "--owner",
            owner,
            "--lease-ms",
            "1500",
            "--pause-after",
            str(pause_after),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_worker_is_resumed_without_re_executing_completed_steps(
    keel_dsn, keel, tenant, new_task, tmp_path
):
    """The acceptance run: a five-step agent is SIGKILLed after step 3 commits; a second
    worker resumes from the step-2 checkpoint, reuses step 3, runs 4 and 5. The provider
    counter (a file, outside the database) reads 5 executions, not 6 or 8, and the resumed
    run's events show the reuse.

    Mutation: reuse_unrecorded"""
    task = new_task()
    key = os.urandom(32).hex()  # a throwaway checkpoint key for this run
    counter = tmp_path / f"provider-calls-{uuid.uuid4().hex}.txt"
    first = start_agent(keel_dsn, key, tenant, task.task_id, counter, "worker-1", pause_after=3)
    try:
        assert first.stdout is not None
        lines = []
        for line in first.stdout:
            lines.append(line)
            if line.strip() == "paused":
                break
        else:
            pytest.fail(f"the first worker ended early: {''.join(lines)}{first.stderr.read()}")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    assert counted(counter) == ["step-1", "step-2", "step-3"]
    killed_at_seq = keel.get_task(tenant, task.task_id).last_event_seq

    second = start_agent(keel_dsn, key, tenant, task.task_id, counter, "worker-2")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, out + err
    assert "resuming at step 3" in out, out
    assert "step 3 committed (reused)" in out, out

    assert counted(counter) == ["step-1", "step-2", "step-3", "step-4", "step-5"]
    resumed = [e for e in keel.task_events(tenant, task.task_id) if e.seq > killed_at_seq]
    reuses = [e for e in resumed if e.event_type == "STEP_RESULT_REUSED"]
    assert [e.payload["step_key"] for e in reuses] == ["step-3"], resumed
    assert reuses[0].fencing_token > 0
    attempts = keel.list_step_attempts(tenant, task.task_id)
    assert [(a.step_key, a.attempt, a.status) for a in attempts] == [
        (f"step-{n}", 1, "succeeded") for n in range(1, 6)
    ]


@pytest.mark.guarantee("G1")
def test_an_agent_runs_steps_and_checkpoints_of_its_own_tenant_only(
    keel, app_keel, tenant, make_tenant, workflow, login_role, new_task
):
    """An agent login with tenant A's token uses the step and checkpoint functions for A;
    B's tenant id is refused, and B's task id finds nothing in A.

    Mutation: plain_tenant_id"""
    provider = StaticKeyProvider(os.urandom(32))
    task = new_task()
    token = keel.claim_lease(tenant, task.task_id, "agent", timedelta(minutes=5)).fencing_token
    other = make_tenant()
    b_task = keel.create_task(other, workflow.name, workflow.version)
    b_token = keel.claim_lease(other, b_task.task_id, "w", timedelta(minutes=5)).fencing_token
    app = Keel(keel.conn, key_provider=provider)
    app.begin_step(other, b_task.task_id, "s", digest("x"), b_token)
    app.complete_step(other, b_task.task_id, "s", b_token, {"of": "b"})
    app.save_checkpoint(other, b_task.task_id, b_token, "SYNTHESIS", {"of": "b"})

    with suite_connect(login_role("keel_agent").dsn, autocommit=True) as conn:
        token_of_a = app_keel.mint_tenant_token(tenant)
        agent = Keel(conn, tenant_token=token_of_a, key_provider=provider)
        assert agent.begin_step(tenant, task.task_id, "s", digest("x"), token).outcome == "started"
        agent.complete_step(tenant, task.task_id, "s", token, {"of": "a"})
        agent.save_checkpoint(tenant, task.task_id, token, "SYNTHESIS", {"of": "a"})
        loaded = agent.load_latest_checkpoint(tenant, task.task_id)
        assert loaded is not None and loaded.payload == {"of": "a"}

        for call in (
            lambda: agent.begin_step(other, b_task.task_id, "s", digest("x"), b_token),
            lambda: agent.complete_step(other, b_task.task_id, "s", b_token, {"stolen": 1}),
            lambda: agent.list_step_attempts(other, b_task.task_id),
            lambda: agent.load_latest_checkpoint(other, b_task.task_id),
            lambda: agent.save_checkpoint(other, b_task.task_id, b_token, "INPUT", {}),
        ):
            with pytest.raises(TenantContextMismatch):
                call()
        with pytest.raises(TaskNotFound):
            agent.begin_step(tenant, b_task.task_id, "s", digest("x"), b_token)
        assert agent.list_step_attempts(tenant, b_task.task_id) == []
        assert agent.load_latest_checkpoint(tenant, b_task.task_id) is None
    reused = app.begin_step(other, b_task.task_id, "s", digest("x"), b_token)
    assert (reused.outcome, reused.result) == ("reused", {"of": "b"})


def test_a_steps_key_cannot_be_reserved_without_its_tasks_lease(keel, tenant, new_task):
    """keel.step_operation_key's space (step:<task>:<step>) is the steps' own: a plain
    reservation of it without the task and its lease is refused, so nobody can take a
    step's key first and keep the step from running.
    No mutation: a guard of reserve_operation's arguments; hash_unchecked is elsewhere."""
    task = new_task()
    key = f"step:{task.task_id}:fetch"
    with pytest.raises(InvalidArgument):
        keel.reserve_operation(tenant, None, key, "step", "h1")
    with pytest.raises(InvalidArgument):
        keel.reserve_operation(tenant, task.task_id, key, "step", "h1")  # no fencing token
    token = keel.claim_lease(tenant, task.task_id, "w").fencing_token
    assert keel.begin_step(tenant, task.task_id, "fetch", "h1", token).outcome == "started"
