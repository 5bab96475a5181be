"""G2 Idempotency: one logical operation per (tenant, idempotency key).

Replaying a key with the same input hash returns the stored outcome; a different
hash, action or task raises idempotency_conflict and changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from agentkeel.client import Keel
from agentkeel.errors import IdempotencyConflict, InvalidArgument, LeaseLost, OperationNotReserved
from agentkeel_conformance.harness import race
from agentkeel_conformance.interleave import wait_until_blocked

pytestmark = pytest.mark.guarantee("G2")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def leased(keel, tenant, new_task):
    """A task leased by this test: (task, fencing token)."""
    task = new_task()
    claimed = keel.claim_lease(tenant, task.task_id, "worker-a")
    return claimed, claimed.fencing_token


def test_a_new_key_is_reserved_and_a_replay_is_in_progress(keel, tenant, leased):
    """No mutation: reserve_operation's replay path has no planted bug yet."""
    task, token = leased
    first = keel.reserve_operation(
        tenant, task.task_id, "charge-1", "charge", digest("a"), fencing_token=token
    )
    again = keel.reserve_operation(
        tenant, task.task_id, "charge-1", "charge", digest("a"), fencing_token=token
    )
    assert (first.outcome, first.state, first.attempts) == ("reserved", "reserved", 1)
    assert first.reserved_fencing_token == token
    assert (again.outcome, again.operation_id, again.attempts) == (
        "in_progress",
        first.operation_id,
        1,
    )


def test_a_replay_after_success_returns_the_stored_result(keel, tenant, leased):
    """No mutation: reserve_operation's replay path has no planted bug yet."""
    task, token = leased
    op = keel.reserve_operation(
        tenant, task.task_id, "charge-1", "charge", digest("a"), fencing_token=token
    )
    keel.complete_operation(
        tenant, op.operation_id, token, {"charge": "ch_1"}, provider_reference="ch_1"
    )
    replay = keel.reserve_operation(
        tenant, task.task_id, "charge-1", "charge", digest("a"), fencing_token=token
    )
    assert replay.outcome == "succeeded"
    assert replay.result == {"charge": "ch_1"}
    assert replay.provider_reference == "ch_1"
    assert replay.attempts == 1


def test_a_replay_after_a_final_failure_returns_the_stored_error(keel, tenant, leased):
    """No mutation: reserve_operation's replay path has no planted bug yet."""
    task, token = leased
    op = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    keel.fail_operation(tenant, op.operation_id, token, {"code": "card_declined"})
    replay = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    assert (replay.outcome, replay.error, replay.attempts) == (
        "failed",
        {"code": "card_declined"},
        1,
    )


def test_a_retryable_failure_is_reserved_again_as_a_new_attempt(keel, tenant, leased):
    """No mutation: the retry path of reserve_operation has no planted bug yet."""
    task, token = leased
    op = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    keel.fail_operation(tenant, op.operation_id, token, {"code": "timeout"}, retryable=True)
    retry = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    assert (retry.outcome, retry.state, retry.attempts, retry.error) == (
        "reserved",
        "reserved",
        2,
        None,
    )
    assert retry.operation_id == op.operation_id


@pytest.mark.parametrize("change", ["input_hash", "action", "task"])
def test_a_reused_key_with_different_input_conflicts(
    keel, connect, tenant, leased, new_task, change
):
    """Mutation: hash_unchecked (the input_hash case)."""
    task, token = leased
    op = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    keel.complete_operation(tenant, op.operation_id, token, {"ok": True})
    args = {"task_id": task.task_id, "action": "charge", "input_hash": digest("a"), "token": token}
    if change == "input_hash":
        args["input_hash"] = digest("b")
    elif change == "action":
        args["action"] = "refund"
    else:
        other = keel.claim_lease(tenant, new_task().task_id, "worker-a")
        args["task_id"], args["token"] = other.task_id, other.fencing_token
    with pytest.raises(IdempotencyConflict) as info:
        keel.reserve_operation(
            tenant,
            args["task_id"],
            "k",
            args["action"],
            args["input_hash"],
            fencing_token=args["token"],
        )
    assert change.replace("task", "task_id") in (info.value.detail or "")


def test_operations_without_a_task_are_idempotent_too(keel, tenant):
    """Mutation: hash_unchecked."""
    first = keel.reserve_operation(tenant, None, "email-42", "send_email", digest("hello"))
    again = keel.reserve_operation(tenant, None, "email-42", "send_email", digest("hello"))
    assert (first.outcome, again.outcome) == ("reserved", "in_progress")
    with pytest.raises(IdempotencyConflict):
        keel.reserve_operation(tenant, None, "email-42", "send_email", digest("bye"))


def test_keys_are_scoped_to_their_tenant(keel, make_tenant):
    """No mutation: the tenant-scoped unique key is schema, not a repeatable file."""
    a, b = make_tenant(), make_tenant()
    ra = keel.reserve_operation(a, None, "same-key", "x", digest("a"))
    rb = keel.reserve_operation(b, None, "same-key", "x", digest("b"))
    assert ra.outcome == rb.outcome == "reserved"
    assert ra.operation_id != rb.operation_id


def test_concurrent_reservations_of_one_key_have_exactly_one_owner(connect, tenant):
    """No mutation: the unique key (schema) serialises them; no function edit plants it."""
    clients = [Keel(connect()) for _ in range(6)]
    outcomes = race(
        [
            functools.partial(c.reserve_operation, tenant, None, "race", "charge", digest("a"))
            for c in clients
        ]
    )
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    kinds = sorted(r.outcome for _, r in outcomes)
    assert kinds == ["in_progress"] * 5 + ["reserved"]
    assert len({r.operation_id for _, r in outcomes}) == 1


def test_concurrent_retries_of_a_retryable_key_start_one_attempt(
    connect, tenant, direct_connection
):
    """A key whose attempt failed retryably is reserved again by two clients while the
    first one's retry is not committed: the second waits for it, then replays it as in
    progress. Attempt 2 is started once, never twice.
    Mutation: retry_unguarded."""
    first, second, control = Keel(connect()), Keel(connect()), connect()
    op = first.reserve_operation(tenant, None, "retry", "charge", digest("a"))
    first.fail_operation(tenant, op.operation_id, None, {"code": "timeout"}, retryable=True)
    with ThreadPoolExecutor(1) as pool:
        with first.transaction(tenant):
            retry = first.reserve_operation(tenant, None, "retry", "charge", digest("a"))
            waiting = pool.submit(
                second.reserve_operation, tenant, None, "retry", "charge", digest("a")
            )
            wait_until_blocked(
                control, second.conn, [first.conn], waiting, "the second reservation"
            )
            assert not waiting.done(), "the second reservation did not wait for the first"
        replay = waiting.result(timeout=60)
    assert (retry.outcome, retry.attempts) == ("reserved", 2)
    assert (replay.outcome, replay.attempts) == ("in_progress", 2)


def test_a_replay_waits_for_no_transaction_finishing_the_operation(connect, tenant):
    """A replay only reads its key: while another transaction finishes the operation (its
    row updated, not committed), a replay answers at once with what is committed, then
    with the stored result. A replay that locked the row would wait for the finisher: the
    lock timeout below turns that wait into a failure.
    No mutation: the read takes no lock; no function edit plants one."""
    holder, keel = Keel(connect()), Keel(connect())
    op = keel.reserve_operation(tenant, None, "held", "charge", digest("a"))
    with holder.transaction(tenant):
        holder.complete_operation(tenant, op.operation_id, None, {"ok": True})
        with keel.transaction(tenant) as conn:
            conn.execute("set local lock_timeout = '1s'")  # SET LOCAL: Citus propagates it
            during = keel.reserve_operation(tenant, None, "held", "charge", digest("a"))
    after = keel.reserve_operation(tenant, None, "held", "charge", digest("a"))
    assert (during.outcome, after.outcome, after.result) == (
        "in_progress",
        "succeeded",
        {"ok": True},
    )


def test_concurrent_reservations_with_different_input_have_one_winner(connect, tenant):
    """Mutation: hash_unchecked."""
    clients = [Keel(connect()) for _ in range(2)]
    outcomes = race(
        [
            lambda: clients[0].reserve_operation(tenant, None, "race", "charge", digest("a")),
            lambda: clients[1].reserve_operation(tenant, None, "race", "charge", digest("b")),
        ]
    )
    oks = [v for kind, v in outcomes if kind == "ok"]
    errors = [v for kind, v in outcomes if kind == "error"]
    assert len(oks) == 1 and oks[0].outcome == "reserved"
    assert len(errors) == 1 and isinstance(errors[0], IdempotencyConflict)


def test_a_finished_operation_cannot_be_finished_again(keel, tenant, leased):
    """No mutation: finish_operation's state check has no planted bug yet."""
    task, token = leased
    op = keel.reserve_operation(
        tenant, task.task_id, "k", "charge", digest("a"), fencing_token=token
    )
    keel.complete_operation(tenant, op.operation_id, token, {"n": 1})
    with pytest.raises(OperationNotReserved):
        keel.complete_operation(tenant, op.operation_id, token, {"n": 2})
    with pytest.raises(OperationNotReserved):
        keel.fail_operation(tenant, op.operation_id, token, {"e": 1})
    assert keel.get_operation(tenant, op.operation_id).result == {"n": 1}


def test_reserving_for_a_task_needs_its_current_lease(keel, tenant, new_task):
    """No mutation: reserve_operation's lease check has no planted bug yet."""
    task = new_task()
    with pytest.raises(LeaseLost):
        keel.reserve_operation(tenant, task.task_id, "k", "charge", digest("a"))
    with pytest.raises(InvalidArgument):
        keel.reserve_operation(tenant, None, "k", "charge", digest("a"), fencing_token=1)


def test_keys_are_kept_for_the_retention_period(keel, tenant):
    """No mutation: interval_compared edits the cap check, not the stored expiry."""
    r = keel.reserve_operation(tenant, None, "k", "x", digest("a"), retention=timedelta(days=3))
    op = keel.get_operation(tenant, r.operation_id)
    assert op.expires_at - op.created_at == timedelta(days=3)


@pytest.mark.parametrize(
    ("key", "action", "input_hash"),
    [("", "x", "h"), ("k" * 256, "x", "h"), ("k", "", "h"), ("k", "x", ""), ("k", "x", "h" * 129)],
)
def test_malformed_arguments_are_refused_with_invalid_argument(
    keel, tenant, key, action, input_hash
):
    """No mutation: reserve_operation's argument checks have no planted bug yet."""
    with pytest.raises(InvalidArgument):
        keel.reserve_operation(tenant, None, key, action, input_hash)


@pytest.mark.parametrize("retention", ["-1000 years 360001 days", "0 days", "11 years"])
def test_retention_is_checked_as_a_timestamp(keel, tenant, retention):
    """'-1000 years 360001 days' compares as one day but ends 14 years before it starts.
    Mutation: interval_compared."""
    with pytest.raises(InvalidArgument), keel.transaction(tenant) as conn:
        conn.execute(
            "select keel.reserve_operation(%s, null, 'k', 'a', 'h', p_retention => %s::interval)",
            (tenant, retention),
        )


def test_a_batch_of_reservations_keeps_each_items_guarantees(keel, tenant, leased):
    """keel.reserve_operations: a new key is reserved, its replay in the same batch is in
    progress, the same key with other input is idempotency_conflict and changes nothing,
    a stale fencing token is lease_lost; the other items are unaffected.
    Mutation: hash_unchecked."""
    task, token = leased
    outcomes = keel.reserve_operations(
        tenant,
        [
            {"idempotency_key": "batch-1", "action": "charge", "input_hash": digest("a"),
             "task_id": task.task_id, "fencing_token": token},
            {"idempotency_key": "batch-1", "action": "charge", "input_hash": digest("a"),
             "task_id": task.task_id, "fencing_token": token},
            {"idempotency_key": "batch-1", "action": "charge", "input_hash": digest("b"),
             "task_id": task.task_id, "fencing_token": token},
            {"idempotency_key": "batch-2", "action": "charge", "input_hash": digest("c"),
             "task_id": task.task_id, "fencing_token": token - 1},
            {"idempotency_key": "batch-3", "action": "refund", "input_hash": digest("d")},
        ],
    )  # fmt: skip
    assert [o.refused.sqlstate if o.refused else o.reservation.outcome for o in outcomes] == [
        "reserved",
        "in_progress",
        "23K01",
        "55K03",
        "reserved",
    ]
    first = outcomes[0].reservation
    assert outcomes[1].reservation.operation_id == first.operation_id
    stored = keel.get_operation(tenant, first.operation_id)
    assert (stored.input_hash, stored.attempts) == (digest("a"), 1)  # the conflict changed nothing
    replay = keel.reserve_operation(tenant, None, "batch-2", "charge", digest("c"))
    assert replay.outcome == "reserved"  # the refused item left no row behind
