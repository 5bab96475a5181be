"""G6 outbox delivery in SQL, without a relay process: claims are fenced by a token, an
expired claim is taken over, failures back off and end dead (then replay keeps the id),
per-key ordering holds, concurrent relays never share a claim, commit order and rollbacks
are respected, the inbox applies an effect once, and keel_relay can do nothing else.

Every test writes messages under a topic prefix of its own and claims only that prefix, so
messages of other tests (or of the database's users) are never touched."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from agentkeel.client import Keel, OutboxMessage
from agentkeel.errors import (
    InvalidArgument,
    MessageNotDead,
    MessageNotFound,
    OutboxClaimLost,
    QuotaExceeded,
)
from agentkeel.pooler import is_pooled
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.fixtures import LoginRole, Workflow
from agentkeel_conformance.harness import in_tenant

pytestmark = pytest.mark.guarantee("G6")

LONG = timedelta(minutes=5)
BLINK = timedelta(milliseconds=20)  # a claim that has expired by the time we look again


@pytest.fixture
def prefix() -> str:
    """A topic prefix private to the test."""
    return f"akc-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def relay_login(login_role: Callable[[str], LoginRole]) -> LoginRole:
    return login_role("keel_relay")


@pytest.fixture
def relay(relay_login: LoginRole) -> Iterator[Callable[[], Keel]]:
    """Clients on their own autocommit connections, each logged in as a keel_relay member."""
    opened: list[psycopg.Connection] = []

    def _relay() -> Keel:
        conn = suite_connect(relay_login.dsn, autocommit=True)
        opened.append(conn)
        return Keel(conn)

    yield _relay
    for conn in opened:
        conn.close()


def write(
    keel: Keel, tenant: uuid.UUID, workflow: Workflow, messages: Sequence[dict[str, Any]]
) -> list[uuid.UUID]:
    """Commit the messages with one transition of a new task; their ids in position order."""
    task = keel.create_task(tenant, workflow.name, workflow.version)
    keel.transition_task(tenant, task.task_id, 1, "running", outbox=messages)
    return ids_of(keel.conn, tenant, task.task_id)


def ids_of(conn: psycopg.Connection, tenant: uuid.UUID, task_id: uuid.UUID) -> list[uuid.UUID]:
    with in_tenant(conn, tenant):
        rows = conn.execute(
            "select message_id from keel.outbox where tenant_id = %s and task_id = %s"
            " order by position",
            (tenant, task_id),
        ).fetchall()
    return [r[0] for r in rows]


def row(conn: psycopg.Connection, tenant: uuid.UUID, message_id: uuid.UUID) -> dict[str, Any]:
    with in_tenant(conn, tenant):
        found = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "select * from keel.outbox where tenant_id = %s and message_id = %s",
                (tenant, message_id),
            )
            .fetchone()
        )
    assert found is not None
    return found


def claim_ids(relay: Keel, prefix: str, **kwargs: Any) -> list[uuid.UUID]:
    return [m.message_id for m in relay.claim_outbox("r", topic_prefix=prefix, **kwargs)]


def claim_soon(relay: Keel, prefix: str, timeout: float = 5.0) -> OutboxMessage:
    """The next message of the prefix, waiting out a backoff (at most the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        claimed = relay.claim_outbox("r", 1, LONG, prefix)
        if claimed or time.monotonic() > deadline:
            assert claimed, "nothing became claimable in time"
            return claimed[0]
        time.sleep(0.05)


@pytest.mark.parametrize("call", ["ack", "nack", "release"])
def test_an_expired_claim_is_taken_over_and_the_stale_token_changes_nothing(
    keel, tenant, workflow, relay, prefix, call
):
    """Relay 1's claim expires; relay 2 claims the message with a higher token. Relay 1's
    ack, nack or release is then refused with outbox_claim_lost and the row is unchanged;
    relay 2's ack counts.
    Mutation: ack_unfenced."""
    [message_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}])
    first, second = relay(), relay()
    [mine] = first.claim_outbox("relay-1", 10, BLINK, prefix)
    assert (mine.message_id, mine.claimed_by, mine.claims, mine.attempts) == (
        message_id,
        "relay-1",
        1,
        0,
    )
    time.sleep(BLINK.total_seconds() * 3)
    [theirs] = second.claim_outbox("relay-2", 10, LONG, prefix)
    assert theirs.message_id == message_id
    assert theirs.claim_token != mine.claim_token
    before = row(keel.conn, tenant, message_id)
    with pytest.raises(OutboxClaimLost):
        if call == "ack":
            first.ack_outbox(tenant, message_id, mine.claim_token)
        elif call == "nack":
            first.nack_outbox(tenant, message_id, mine.claim_token, "late", dead=True)
        else:
            first.release_outbox(tenant, message_id, mine.claim_token)
    assert row(keel.conn, tenant, message_id) == before
    second.ack_outbox(tenant, message_id, theirs.claim_token)
    assert row(keel.conn, tenant, message_id)["state"] == "delivered"


def test_ack_is_fenced_idempotent_and_names_unknown_messages(keel, tenant, workflow, relay, prefix):
    """An ack without a claim, or with a token never issued, is refused; an ack repeated
    with the current token is a no-op; an unknown message is message_not_found. An expired
    claim nobody took over may still be acked.
    Mutation: ack_unfenced."""
    [message_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}])
    r = relay()
    with pytest.raises(OutboxClaimLost):
        r.ack_outbox(tenant, message_id, 0)  # never claimed
    [claimed] = r.claim_outbox("r", 1, BLINK, prefix)
    with pytest.raises(OutboxClaimLost):
        r.ack_outbox(tenant, message_id, claimed.claim_token + 1)
    time.sleep(BLINK.total_seconds() * 3)  # expired, but nobody claimed it since
    r.ack_outbox(tenant, message_id, claimed.claim_token)
    r.ack_outbox(tenant, message_id, claimed.claim_token)  # a retried ack
    delivered = row(keel.conn, tenant, message_id)
    assert delivered["state"] == "delivered" and delivered["delivered_at"] is not None
    assert claim_ids(r, prefix) == []
    with pytest.raises(MessageNotFound):
        r.ack_outbox(tenant, uuid.uuid4(), 1)
    with pytest.raises(MessageNotFound):  # the right id under another tenant's name
        r.ack_outbox(uuid.uuid4(), message_id, claimed.claim_token)


def test_a_batch_of_acks_acks_each_current_claim_and_refuses_the_rest_alone(
    keel, tenant, workflow, relay, prefix
):
    """keel.ack_outbox_messages, the relay's batch of acks: each item is fenced as
    ack_outbox is. An item with a token that is not the current claim (or of a message never
    claimed) is refused with outbox_claim_lost and changes nothing, an unknown message or
    the right id under another tenant's name with message_not_found; the other items are
    delivered, and the ack of a key's head makes the next message of its key claimable. A
    repeated item, or the whole batch again, changes nothing more.
    Mutation: batch_ack_unfenced."""
    t = f"{prefix}t"
    first, second, never = write(keel, tenant, workflow, [{"topic": t}] * 3)
    head, behind = write(keel, tenant, workflow, [{"topic": f"{prefix}k", "key": "k"}] * 2)
    r = relay()
    claimed = {m.message_id: m for m in r.claim_outbox("r", 10, LONG, prefix)}
    assert set(claimed) == {first, second, never, head}
    r.release_outbox(tenant, never, claimed[never].claim_token)  # claimed no more
    items = [
        (tenant, first, claimed[first].claim_token),
        (tenant, second, claimed[second].claim_token + 1),
        (tenant, never, claimed[never].claim_token),
        (tenant, uuid.uuid4(), 1),
        (uuid.uuid4(), head, claimed[head].claim_token),
        (tenant, head, claimed[head].claim_token),
        (tenant, first, claimed[first].claim_token),
    ]
    batch = [{"tenant_id": a, "message_id": b, "claim_token": c} for a, b, c in items]
    outcomes = r.ack_outbox_messages(batch)
    assert [o.item for o in outcomes] == list(range(1, 8))
    assert [o.message_id for o in outcomes] == [b for _, b, _ in items]
    refused = [o.refused.sqlstate if o.refused else None for o in outcomes]
    assert refused == [None, "55K08", "55K08", "42K08", "42K08", None, None]
    states = {m: row(keel.conn, tenant, m)["state"] for m in (first, second, never, head)}
    assert states == {
        first: "delivered",
        second: "pending",
        never: "pending",
        head: "delivered",
    }
    assert row(keel.conn, tenant, second)["claim_token"] == claimed[second].claim_token
    assert set(claim_ids(r, prefix)) == {behind, never}  # with the key's next message
    again = r.ack_outbox_messages(batch)
    assert [o.refused.sqlstate if o.refused else None for o in again] == refused
    r.ack_outbox(tenant, second, claimed[second].claim_token)  # its holder still can
    with pytest.raises(InvalidArgument):
        r.ack_outbox_messages([{"tenant_id": tenant, "message_id": "not a uuid", "claim_token": 1}])


@pytest.fixture
def max_attempts(owner_dsn: str, prefix: str) -> Iterator[Callable[[str, int], None]]:
    """Set keel.outbox_topics limits for topics of this test; removed afterwards."""
    topics: list[str] = []
    with suite_connect(owner_dsn, autocommit=True) as owner:

        def _set(topic: str, limit: int) -> None:
            assert topic.startswith(prefix)
            owner.execute(
                "insert into keel.outbox_topics (topic, max_attempts) values (%s, %s)",
                (topic, limit),
            )
            topics.append(topic)

        try:
            yield _set
        finally:
            owner.execute("delete from keel.outbox_topics where topic = any(%s)", (topics,))


def test_a_message_is_dead_after_max_attempts_then_replayed_under_the_same_id(
    keel, tenant, workflow, relay, prefix, max_attempts
):
    """Two failures on a topic allowed two attempts: dead, with the last error, listed by
    dead_outbox; replay puts it back under the same message id, claimable at once.
    No mutation: fails outright if nack never ends dead or replay mints a new id."""
    topic = f"{prefix}t"
    max_attempts(topic, 2)
    [message_id] = write(keel, tenant, workflow, [{"topic": topic, "payload": {"n": 1}}])
    r = relay()
    first = claim_soon(r, prefix)
    after_first = r.nack_outbox(tenant, message_id, first.claim_token, "503 from the sink")
    assert (after_first.state, after_first.attempts) == ("pending", 1)
    with pytest.raises(MessageNotDead):
        keel.replay_outbox(tenant, message_id)
    second = claim_soon(r, prefix)  # after the backoff
    assert (second.attempts, second.claims) == (1, 1)
    dead = r.nack_outbox(tenant, message_id, second.claim_token, "x" * 5000)
    assert (dead.state, dead.attempts) == ("dead", 2) and dead.dead_at is not None
    assert dead.last_error == "x" * 4000
    assert claim_ids(r, prefix) == []
    listed = keel.dead_outbox(tenant, topic=topic)
    assert [m.message_id for m in listed] == [message_id]
    assert keel.dead_outbox(tenant, topic=topic, after=message_id) == []

    replayed = keel.replay_outbox(tenant, message_id)
    assert (replayed.message_id, replayed.state, replayed.attempts, replayed.claims) == (
        message_id,
        "pending",
        0,
        0,
    )
    again = r.claim_outbox("r", 10, LONG, prefix)
    assert [(m.message_id, m.payload) for m in again] == [(message_id, {"n": 1})]
    assert again[0].claim_token != second.claim_token


def test_a_dead_message_is_replayed_only_within_the_tenants_pending_quota(
    keel, connect, tenant, workflow, relay, prefix, max_attempts
):
    """Replay puts a message back to pending, so it counts against the tenant's pending
    messages as a new one would: with the tenant's own limit of 1 (keel.set_tenant_quota)
    and one message pending, replaying a dead one is refused with quota_exceeded (54K01)
    and changes nothing; once the pending one is delivered, the replay goes through.
    No mutation: the generated mutants disable this guard (tests/test_mutants.py)."""
    topic = f"{prefix}t"
    max_attempts(topic, 1)
    [dead_id] = write(keel, tenant, workflow, [{"topic": topic}])
    r = relay()
    first = claim_soon(r, prefix)
    assert r.nack_outbox(tenant, dead_id, first.claim_token, "refused").state == "dead"
    connect(owner=True).execute(
        "select keel.set_tenant_quota(%s, 'max_tenant_pending_messages', 1)", (tenant,)
    )
    [pending_id] = write(keel, tenant, workflow, [{"topic": topic}])
    with pytest.raises(QuotaExceeded):
        keel.replay_outbox(tenant, dead_id)
    assert row(keel.conn, tenant, dead_id)["state"] == "dead"
    delivered = claim_soon(r, prefix)
    assert delivered.message_id == pending_id
    r.ack_outbox(tenant, pending_id, delivered.claim_token)
    assert keel.replay_outbox(tenant, dead_id).state == "pending"


def unreported_claims_limit(keel: Keel, tenant: uuid.UUID) -> int:
    with in_tenant(keel.conn, tenant):
        row = keel.conn.execute(
            "select coalesce((select value::integer from keel.settings"
            " where setting = 'outbox_max_unreported_claims'), 20)"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_crash_between_publish_and_ack_spends_no_attempt(
    keel, tenant, workflow, relay, prefix, max_attempts
):
    """Attempts are failed deliveries, not claims: claims that expire with no ack or nack
    (a relay killed after publishing, again and again) leave the attempts untouched, so a
    message the sink confirmed is never dead for it; the nack after them is attempt 1.
    Mutation: attempts_at_claim."""
    topic = f"{prefix}crashy"
    max_attempts(topic, 2)
    [message_id] = write(keel, tenant, workflow, [{"topic": topic}])
    r = relay()
    crashes = min(4, unreported_claims_limit(keel, tenant) - 1)
    for claim in range(1, crashes + 1):
        [claimed] = r.claim_outbox("crashing", 1, BLINK, prefix)
        assert (claimed.message_id, claimed.attempts, claimed.claims) == (message_id, 0, claim)
        time.sleep(BLINK.total_seconds() * 3)
    [last] = r.claim_outbox("relay", 1, LONG, prefix)
    assert (last.attempts, last.claims) == (0, crashes + 1)
    nacked = r.nack_outbox(tenant, message_id, last.claim_token, "HTTP 503")
    assert (nacked.state, nacked.attempts, nacked.claims) == ("pending", 1, 0)


def test_a_relay_that_crashes_on_every_claim_still_drives_the_message_dead(
    keel, tenant, workflow, relay, prefix
):
    """A message whose claims all end with no report (a relay that crashes on it) is not
    handed out forever: after settings.outbox_max_unreported_claims of them the next claim
    marks it dead, with attempts still 0 and the count in last_error.
    No mutation: it fails outright when claims are not counted."""
    topic = f"{prefix}poison"
    limit = unreported_claims_limit(keel, tenant)
    if limit > 50:
        pytest.skip(f"outbox_max_unreported_claims is {limit}: too many claims to wait out")
    [message_id] = write(keel, tenant, workflow, [{"topic": topic}])
    r = relay()
    for claim in range(1, limit + 1):
        [claimed] = r.claim_outbox("crashing", 1, BLINK, prefix)
        assert (claimed.message_id, claimed.claims) == (message_id, claim)
        time.sleep(BLINK.total_seconds() * 3)
    assert r.claim_outbox("crashing", 1, LONG, prefix) == []
    [dead] = keel.dead_outbox(tenant, topic=topic)
    assert (dead.message_id, dead.attempts) == (message_id, 0)
    assert dead.last_error is not None and f"claimed {limit} times" in dead.last_error


def test_a_nack_backs_off_within_the_documented_bound(keel, tenant, workflow, relay, prefix):
    """The delay after the first failure lies within base * 2^0 (full jitter, capped).
    No mutation: the jitter is random; only its documented bound is checked."""
    [message_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}])
    r = relay()
    [claimed] = r.claim_outbox("r", 1, LONG, prefix)
    nacked = r.nack_outbox(tenant, message_id, claimed.claim_token, "timeout")
    with in_tenant(keel.conn, tenant):
        base, delay = keel.conn.execute(
            "select (select value::interval from keel.settings"
            " where setting = 'outbox_backoff_base'), %s - now()",
            (nacked.available_at,),
        ).fetchone()
    assert -timedelta(seconds=1) <= delay <= base
    assert nacked.claimed_by is None and nacked.last_error == "timeout"


def test_release_gives_the_claim_back_without_spending_an_attempt(
    keel, tenant, workflow, relay, prefix
):
    """A release (the relay stopping, or its sink unreachable) spends no attempt.
    No mutation: a shutdown path; its fencing is the same check as ack's (ack_unfenced)."""
    [message_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}])
    r = relay()
    [claimed] = r.claim_outbox("r", 1, LONG, prefix)
    r.release_outbox(tenant, message_id, claimed.claim_token)
    [again] = r.claim_outbox("r", 1, LONG, prefix)
    assert again.message_id == message_id
    assert (again.attempts, again.claims) == (0, 1)
    assert again.claim_token != claimed.claim_token


def test_the_relay_replays_a_dead_message_of_any_tenant_and_only_a_dead_one(
    keel, tenant, workflow, relay, prefix
):
    """keel_relay, which has no tenant context, replays a dead message under the same id,
    attempts and claims 0; a pending message is message_not_dead and an unknown one (or
    the right id under another tenant) message_not_found. Who may call it (keel_relay
    alone) is pinned by agentkeel check (shipped_grants).
    No mutation: it fails outright if the replay mints a new id or revives a live message."""
    [dead_id, live_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}] * 2)
    r = relay()
    claimed = {m.message_id: m for m in r.claim_outbox("r", 10, LONG, prefix)}
    r.nack_outbox(tenant, dead_id, claimed[dead_id].claim_token, "HTTP 410", dead=True)
    replayed = r.relay_replay_outbox(tenant, dead_id)
    assert (replayed.message_id, replayed.state, replayed.attempts, replayed.claims) == (
        dead_id,
        "pending",
        0,
        0,
    )
    with pytest.raises(MessageNotDead):
        r.relay_replay_outbox(tenant, live_id)
    with pytest.raises(MessageNotFound):
        r.relay_replay_outbox(uuid.uuid4(), dead_id)


def test_a_live_claim_cannot_be_guessed_by_another_relay(keel, tenant, workflow, relay, prefix):
    """Claim tokens are random, not the previous one plus one, and a refusal never shows
    the current one: another relay, which can see message ids, cannot ack, nack or
    release a claim it does not hold (a sequential token was one guess away, and release
    gave the attempt back).
    Mutation: claim_token_sequential."""
    [message_id] = write(keel, tenant, workflow, [{"topic": f"{prefix}t"}])
    holder, other = relay(), relay()
    [claimed] = holder.claim_outbox("holder", 1, LONG, prefix)
    for guess in range(0, 64):
        with pytest.raises(OutboxClaimLost) as info:
            other.ack_outbox(tenant, message_id, guess)
        assert str(claimed.claim_token) not in f"{info.value.message} {info.value.detail}"
    holder.ack_outbox(tenant, message_id, claimed.claim_token)


def test_per_key_ordering_holds_back_later_messages_of_a_key(
    keel, make_tenant, workflow, relay, prefix
):
    """The second message of a key is not claimed while the first is pending or in flight,
    nor while it backs off after a failure; other keys and unkeyed messages flow.
    No mutation: seen failing with the ordering clause removed; one G6 mutation is enough."""
    tenant, other = make_tenant(), make_tenant()
    t = f"{prefix}t"
    k1, k1_later, k2, unkeyed = write(
        keel,
        tenant,
        workflow,
        [
            {"topic": t, "key": "k1"},
            {"topic": t, "key": "k1"},
            {"topic": t, "key": "k2"},
            {"topic": t},
        ],
    )
    [k1_last] = write(keel, tenant, workflow, [{"topic": t, "key": "k1"}])
    r = relay()
    first = {m.message_id: m for m in r.claim_outbox("r", 10, LONG, prefix)}
    assert set(first) == {k1, k2, unkeyed}
    assert claim_ids(r, prefix) == []  # k1 is in flight: its later messages wait
    r.nack_outbox(tenant, k1, first[k1].claim_token, "retry later")
    retried = claim_soon(r, prefix)
    assert retried.message_id == k1  # not k1_later, although it was due all along
    r.ack_outbox(tenant, k1, retried.claim_token)
    [later] = r.claim_outbox("r", 10, LONG, prefix)
    assert later.message_id == k1_later
    # Another tenant's message under the same key is not held back by this tenant's.
    [foreign] = write(keel, other, workflow, [{"topic": t, "key": "k1"}])
    assert claim_ids(r, prefix) == [foreign]
    r.ack_outbox(tenant, k1_later, later.claim_token)
    assert claim_ids(r, prefix) == [k1_last]


def test_a_dead_message_no_longer_holds_its_key_back(keel, tenant, workflow, relay, prefix):
    """The first message of a key goes dead: the next one is claimable at once.
    No mutation: it fails outright if a dead message kept holding its key."""
    t = f"{prefix}t"
    first, second = write(keel, tenant, workflow, [{"topic": t, "key": "k"}] * 2)
    r = relay()
    [head] = r.claim_outbox("r", 10, LONG, prefix)
    assert head.message_id == first
    r.nack_outbox(tenant, first, head.claim_token, "HTTP 410", dead=True)
    [nxt] = r.claim_outbox("r", 10, LONG, prefix)
    assert nxt.message_id == second
    r.ack_outbox(tenant, second, nxt.claim_token)
    assert claim_ids(r, prefix) == []


def test_writers_and_a_relay_racing_on_one_key_leave_nothing_stuck(
    keel, tenant, workflow, relay, prefix, connect
):
    """Four writers commit messages on one key (two per transition, on tasks of their
    own) while a relay claims and acks: a claim never holds two messages of the key, each
    transition's messages are delivered in position order, and once the writers are done
    every message is delivered (the relay sweeping held messages when a claim finds
    nothing, as `agentkeel relay` does): none is left waiting behind a message that is
    gone. Seen failing with the ordering clause removed (two messages of the key in one
    claim).
    No mutation: the ordering clause has no planted bug; outbox_dropped covers the writes."""
    t = f"{prefix}t"
    written: list[list[uuid.UUID]] = []
    errors: list[BaseException] = []
    writers_done = threading.Event()

    def write_some() -> None:
        try:
            own = Keel(connect())
            for _ in range(8):
                written.append(write(own, tenant, workflow, [{"topic": t, "key": "hot"}] * 2))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=write_some) for _ in range(4)]
    for thread in threads:
        thread.start()
    r = relay()
    delivered: list[uuid.UUID] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = writers_done.is_set()
        batch = r.claim_outbox("r", 10, LONG, prefix)
        assert len(batch) <= 1, f"two messages of one key claimed at once: {batch}"
        for message in batch:
            r.ack_outbox(tenant, message.message_id, message.claim_token)
            delivered.append(message.message_id)
        if not batch and r.sweep_outbox_heads() == 0 and done:
            break
        if not any(thread.is_alive() for thread in threads):
            writers_done.set()
    assert not errors, errors
    expected = [m for pair in written for m in pair]
    missing = set(expected) - set(delivered)
    assert not missing, f"{len(missing)} of {len(expected)} messages stuck behind their key"
    assert len(delivered) == len(expected) == 64
    place = {m: i for i, m in enumerate(delivered)}
    assert all(place[a] < place[b] for a, b in written)


def test_a_message_written_while_the_one_ahead_of_it_is_acked_is_claimed_after_the_sweep(
    keel, tenant, workflow, relay, prefix, connect
):
    """A writer sees the first message of its key pending and holds its own behind it;
    the relay acks the first before the writer commits, so the ack cannot see the new
    message to promote it. No lock orders the two (neither waits on the other): the
    relay's sweep makes it claimable, and it is claimed.
    Mutation: sweep_blind."""
    t = f"{prefix}t"
    [first] = write(keel, tenant, workflow, [{"topic": t, "key": "k"}])
    r = relay()
    [claimed] = r.claim_outbox("r", 10, LONG, prefix)
    assert claimed.message_id == first
    slow = Keel(connect())
    with slow.transaction(tenant):
        [late] = write(slow, tenant, workflow, [{"topic": t, "key": "k"}])
        r.ack_outbox(tenant, first, claimed.claim_token)
    assert row(keel.conn, tenant, late)["held"], "the writer saw the first message pending"
    early = claim_ids(r, prefix)
    if early:
        # Another relay's sweep running at the same time (the sweep is across tenants)
        # promoted it first: claimable now, and held no longer.
        assert early == [late] and not row(keel.conn, tenant, late)["held"]
        return
    # This sweep, or another relay's running at the same time, promotes it.
    r.sweep_outbox_heads()
    assert not row(keel.conn, tenant, late)["held"]
    assert claim_ids(r, prefix) == [late]


def test_two_first_messages_of_a_key_written_at_once_are_claimed_one_at_a_time(
    keel, tenant, workflow, relay, prefix, connect
):
    """Two writers each write the first message of a key in transactions open at once:
    neither sees the other's, so neither is held. The claim still takes only the older
    one, then the other once the first is acked.
    Mutation: claim_trusts_held."""
    t = f"{prefix}t"
    one, two = Keel(connect()), Keel(connect())
    with one.transaction(tenant):
        [older] = write(one, tenant, workflow, [{"topic": t, "key": "k"}])
        with two.transaction(tenant):
            [newer] = write(two, tenant, workflow, [{"topic": t, "key": "k"}])
    assert not row(keel.conn, tenant, older)["held"]
    assert not row(keel.conn, tenant, newer)["held"]
    r = relay()
    [claimed] = r.claim_outbox("r", 10, LONG, prefix)
    assert claimed.message_id == older
    assert claim_ids(r, prefix) == []
    r.ack_outbox(tenant, older, claimed.claim_token)
    assert claim_ids(r, prefix) == [newer]


def test_four_concurrent_relays_never_share_a_claim_and_claim_everything(
    keel, tenant, workflow, relay, prefix
):
    """Four relays on their own connections claim in small batches at once: no message is
    handed to two of them, and together they claim every message.
    No mutation: SKIP LOCKED and the recheck are PostgreSQL's; fairness covers the scan."""
    expected: set[uuid.UUID] = set()
    for _ in range(8):
        expected.update(
            write(keel, tenant, workflow, [{"topic": f"{prefix}t{i}"} for i in range(25)])
        )
    relays = [relay() for _ in range(4)]
    claimed: list[list[tuple[uuid.UUID, int]]] = [[] for _ in relays]
    errors: list[BaseException] = []
    start = threading.Barrier(len(relays))

    def run(i: int) -> None:
        try:
            start.wait()
            while True:
                batch = relays[i].claim_outbox(f"relay-{i}", 7, LONG, prefix)
                if not batch:
                    return
                claimed[i].extend((m.message_id, m.claim_token) for m in batch)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(relays))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    every = [c for per_relay in claimed for c in per_relay]
    assert len(every) == len({m for m, _ in every}), "a message was claimed twice"
    assert {m for m, _ in every} == expected
    assert sum(1 for per_relay in claimed if per_relay) >= 2, "the relays did not overlap"


def test_a_message_that_commits_after_a_later_one_is_still_claimed(
    keel, tenant, workflow, relay, prefix, connect
):
    """Message ids are time-ordered, commits are not: s1 writes "first" and commits after
    s2 wrote and committed "second". A claim in between sees "second" only; the next claim
    gets "first" (no high-water mark skips it).
    No mutation: a high-water-mark claim fails it outright."""
    t1 = keel.create_task(tenant, workflow.name, workflow.version)
    t2 = keel.create_task(tenant, workflow.name, workflow.version)
    r = relay()
    slow = Keel(connect())
    with slow.transaction(tenant):
        slow.transition_task(tenant, t1.task_id, 1, "running", outbox=[{"topic": f"{prefix}first"}])
        keel.transition_task(
            tenant, t2.task_id, 1, "running", outbox=[{"topic": f"{prefix}second"}]
        )
        assert [m.topic for m in r.claim_outbox("r", 10, LONG, prefix)] == [f"{prefix}second"]
    [first] = ids_of(keel.conn, tenant, t1.task_id)
    [late] = ids_of(keel.conn, tenant, t2.task_id)
    assert first < late, "the slow transaction's message has the earlier id"
    assert claim_ids(r, prefix) == [first]


def test_a_message_from_a_rolled_back_transaction_is_never_claimable(
    keel, tenant, workflow, relay, prefix, connect
):
    """A transition whose transaction rolls back leaves no message: the claim never sees
    one, during the transaction or after it.
    No mutation: PostgreSQL's atomicity; outbox_dropped covers the committed side."""
    task = keel.create_task(tenant, workflow.name, workflow.version)
    r = relay()
    app = Keel(connect())
    with pytest.raises(RuntimeError), app.transaction(tenant):
        app.transition_task(tenant, task.task_id, 1, "running", outbox=[{"topic": f"{prefix}t"}])
        assert claim_ids(r, prefix) == []
        raise RuntimeError("roll back")
    assert claim_ids(r, prefix) == []
    assert ids_of(keel.conn, tenant, task.task_id) == []


def test_the_inbox_applies_each_effect_once(keel, tenant, workflow):
    """A consumer accepts a message id in the transaction that applies the effect: a
    delivery whose transaction rolls back leaves no trace, the next one applies it, and
    every redelivery after that is refused (false) without an effect.
    No mutation: a unique key does the work; the test fails outright without it."""
    message_id = uuid.uuid4()
    consumer = "akc-consumer"
    answers: list[bool] = []

    def deliver(fail: bool) -> None:
        with keel.transaction(tenant):
            accepted = keel.inbox_accept(tenant, consumer, message_id)
            answers.append(accepted)
            if accepted:  # the effect: a task, in the same transaction
                keel.create_task(tenant, workflow.name, workflow.version)
            if fail:
                raise RuntimeError("the consumer crashed before commit")

    with pytest.raises(RuntimeError):
        deliver(fail=True)
    for _ in range(3):
        deliver(fail=False)
    assert answers == [True, True, False, False]
    assert len(keel.list_tasks(tenant)) == 1
    assert keel.inbox_accept(tenant, "another-consumer", message_id) is True
    with pytest.raises(InvalidArgument):
        keel.inbox_accept(tenant, "", message_id)


def test_the_relay_role_can_claim_and_ack_but_read_or_write_nothing_else(
    keel, tenant, workflow, relay
):
    """keel_relay has EXECUTE on the claim, ack, nack, release and status functions only,
    and reads the metadata of every tenant's messages (what its claim scans on Citus),
    never a payload or headers: no other table or view, no tenant function. Tenant reads
    need a tenant context it cannot set.
    No mutation: the grants are also pinned by agentkeel check (shipped_grants)."""
    write(keel, tenant, workflow, [{"topic": "akc-private", "payload": {"n": 1}}])
    conn = relay().conn
    refused = [
        ("select payload from keel.outbox", ()),
        ("select headers from keel.outbox", ()),
        ("select * from keel.outbox", ()),
        ("select count(*) from keel.outbox_events", ()),
        ("select count(*) from keel.inbox", ()),
        ("update keel.outbox set state = 'delivered' where tenant_id = %s", (tenant,)),
        ("select keel.create_task(%s, %s, %s)", (tenant, workflow.name, workflow.version)),
        ("select keel.inbox_accept(%s, 'c', %s)", (tenant, uuid.uuid4())),
        ("select keel.dead_outbox(%s)", (tenant,)),
        ("select keel.replay_outbox(%s, %s)", (tenant, uuid.uuid4())),
        ("select keel.list_tasks(%s)", (tenant,)),
    ]
    for query, params in refused:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(query, params)
    statuses = Keel(conn).outbox_status()
    assert all(s.pending + s.in_flight + s.dead > 0 for s in statuses)


def test_a_tenant_holding_locks_on_its_messages_does_not_stall_another_tenants_claim(
    make_tenant, keel, workflow, relay, prefix, connect
):
    """Tenant A's messages are older and every one of them is row-locked by an open
    transaction (more than any batch); B's message is newer. A claim of one message still
    returns B's, at once. (An application role cannot lock outbox rows itself: FOR UPDATE
    needs UPDATE. The owner's session stands in for anything that holds such locks.)
    No mutation: the scan is claim_next_task's, whose claim_window mutation is planted."""
    a, b = make_tenant(), make_tenant()
    a_ids = write(keel, a, workflow, [{"topic": f"{prefix}a"} for _ in range(70)])
    [b_id] = write(keel, b, workflow, [{"topic": f"{prefix}b"}])
    holder = connect(owner=True)
    with in_tenant(holder, a):
        holder.execute(
            "select 1 from keel.outbox where tenant_id = %s and message_id = any(%s) for update",
            (a, a_ids),
        )
        assert claim_ids(relay(), prefix, limit=1, lease=LONG) == [b_id]


def test_one_tenants_backlog_does_not_stand_in_front_of_another_tenants_message(
    make_tenant, keel, workflow, relay, prefix
):
    """Tenant A commits 300 messages, then tenant B one. The next claim of 100 holds B's
    message: half of each claim is shared among the tenants with due messages, so B waits
    for one claim, not behind A's backlog (three claims).
    Mutation: claim_outbox_unfair"""
    a, b = make_tenant(), make_tenant()
    write(keel, a, workflow, [{"topic": f"{prefix}a"} for _ in range(300)])
    [b_id] = write(keel, b, workflow, [{"topic": f"{prefix}b"}])
    got = claim_ids(relay(), prefix, limit=100, lease=LONG)
    assert len(got) == 100
    assert b_id in got, "tenant B's message waits behind tenant A's backlog"


def test_outbox_status_counts_without_payloads(keel, tenant, workflow, relay, prefix):
    """No mutation: a read-only report for operators."""
    write(keel, tenant, workflow, [{"topic": f"{prefix}s"} for _ in range(3)])
    r = relay()
    [claimed] = r.claim_outbox("r", 1, LONG, prefix)
    r.nack_outbox(tenant, claimed.message_id, claimed.claim_token, "no", dead=True)
    r.claim_outbox("r", 1, LONG, prefix)
    [status] = [s for s in r.outbox_status() if s.topic == f"{prefix}s"]
    assert (status.pending, status.in_flight, status.dead) == (1, 1, 1)
    assert status.oldest_pending_age is not None and status.oldest_pending_age >= timedelta(0)


def test_a_transition_that_writes_messages_wakes_listening_relays(
    tenant, workflow, connect, prefix, on_citus
):
    """NOTIFY keel_outbox, at commit, once per transition that wrote a message; none for
    a transition without messages. A hint only: relays poll as well. (The session listens
    to its own transitions and counts only its own notifications, by backend pid: other
    sessions of a parallel run notify the same channel.)
    No mutation: a wake-up hint; delivery never depends on it."""
    if on_citus:
        pytest.skip(
            "on Citus transition_task runs on the worker that holds the tenant, and its"
            " NOTIFY reaches listeners of that node only: relays poll (docs/citus.md)"
        )
    conn = connect()
    if is_pooled(conn):
        pytest.skip("LISTEN needs a session of its own: a transaction pooler cannot keep one")
    own: list[str] = []
    conn.add_notify_handler(
        lambda n: own.append(n.channel) if n.pid == conn.info.backend_pid else None
    )
    conn.execute("listen keel_outbox")
    app = Keel(conn)
    quiet = app.create_task(tenant, workflow.name, workflow.version)
    app.transition_task(tenant, quiet.task_id, 1, "running")
    conn.execute("select 1")
    assert own == []
    write(app, tenant, workflow, [{"topic": f"{prefix}a"}, {"topic": f"{prefix}b"}])
    conn.execute("select 1")
    assert own == ["keel_outbox"]
    with pytest.raises(RuntimeError), app.transaction(tenant):
        task = app.create_task(tenant, workflow.name, workflow.version)
        app.transition_task(tenant, task.task_id, 1, "running", outbox=[{"topic": f"{prefix}c"}])
        raise RuntimeError("roll back: no message, no notification")
    conn.execute("select 1")
    assert own == ["keel_outbox"]


def test_the_debezium_view_maps_the_outbox_for_the_tenant_in_context(
    keel, make_tenant, workflow, prefix
):
    """The view's columns carry Debezium's names; it reads with the reader's rights.
    No mutation: a read-only view; agentkeel check keeps it security_invoker."""
    a, b = make_tenant(), make_tenant()
    [mid] = write(
        keel,
        a,
        workflow,
        [
            {
                "topic": f"{prefix}orders",
                "key": "o-1",
                "headers": {"type": "Created"},
                "payload": [1],
            }
        ],
    )
    write(keel, b, workflow, [{"topic": f"{prefix}orders"}])
    with in_tenant(keel.conn, a):
        rows = keel.conn.execute(
            "select id, aggregatetype, aggregateid, type, payload from keel.outbox_events"
            " where tenant_id = %s and aggregatetype like %s",
            (a, f"{prefix}%"),
        ).fetchall()
    assert rows == [(mid, f"{prefix}orders", "o-1", "Created", [1])]


def test_claim_arguments_are_checked(relay):
    """Batch size and lease are checked (the lease as the task lease is).
    No mutation: the shared lease check is covered by interval_compared."""
    r = relay()
    for kwargs in ({"limit": 0}, {"limit": 1001}, {"lease": timedelta(days=8)}):
        with pytest.raises(InvalidArgument):
            r.claim_outbox("r", topic_prefix="akc-none/", **kwargs)
    with pytest.raises(InvalidArgument):
        r.claim_outbox("", topic_prefix="akc-none/")


def test_the_per_tenant_claim_takes_one_named_message_once(keel, tenant, workflow, relay, prefix):
    """keel.claim_due_message (the per-tenant step of the relay's claim on Citus) claims the
    message it names while it is pending and due, once: a second call gets no row. A call
    that names no message is refused (22K01), not answered with no row as if the message
    were taken.
    No mutation: the generated mutants disable its argument check (tests/test_mutants.py)."""
    (message_id,) = write(keel, tenant, workflow, [{"topic": prefix + "t"}])
    conn = relay().conn
    claim = (
        "select message_id, claim_token"
        " from keel.claim_due_message(%s, %s, 'r', interval '1 minute', %s)"
    )
    got = conn.execute(claim, (tenant, message_id, prefix)).fetchall()
    assert [r[0] for r in got] == [message_id]
    assert conn.execute(claim, (tenant, message_id, prefix)).fetchall() == []
    # Only the message id: a NULL tenant, the distribution argument, is refused by the
    # client before it is sent (Citus 13.2 fails on it, docs/citus.md).
    with pytest.raises(psycopg.Error) as info:
        conn.execute(claim, (tenant, None, prefix)).fetchall()
    assert info.value.sqlstate == "22K01"


CLAIM_DUE = "select * from keel.claim_due_messages(%s, %s::uuid[], 'r')"
ACK_TENANT = "select * from keel.ack_tenant_outbox_messages(%s, %s::uuid[], %s::bigint[])"


@pytest.mark.parametrize(
    ("call", "args", "problem"),
    [
        (CLAIM_DUE, lambda ids: [ids], "a claim takes 1 to"),
        (CLAIM_DUE, lambda ids: [[None]], "ids are required"),
        (ACK_TENANT, lambda ids: [ids, [1] * len(ids)], "a batch holds at most"),
        (ACK_TENANT, lambda ids: [ids[:2], [1]], "as many message ids"),
        (ACK_TENANT, lambda ids: [[[ids[0]]], [[1]]], "in arrays from 1"),
        (ACK_TENANT, lambda ids: [[None], [1]], "must not be null"),
    ],
    ids=[
        "claim_over_the_limit",
        "claim_null_id",
        "acks_over_the_limit",
        "acks_unpaired",
        "acks_two_dimensions",
        "acks_null_id",
    ],
)
def test_the_per_tenant_steps_check_their_arguments(tenant, relay, call, args, problem):
    """keel.claim_due_messages and keel.ack_tenant_outbox_messages (the relay's per-tenant
    steps) take at most settings.max_batch_items messages, none of them null, and the acks
    as many tokens as messages, in arrays from 1: anything else is invalid_argument
    (22K01), before a message is touched.
    No mutation: the generated mutants disable each check (tests/test_mutants.py)."""
    conn = relay().conn
    [(most,)] = conn.execute("select keel.max_batch_items()").fetchall()
    ids = [uuid.uuid4() for _ in range(most + 1)]
    with pytest.raises(psycopg.Error, match=problem) as info:
        conn.execute(call, [tenant, *args(ids)]).fetchall()
    assert info.value.sqlstate == "22K01"
