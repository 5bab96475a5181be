"""The pending-message counter (migration 0047, keel.pending_message_counts): every way a
message becomes pending or stops being pending keeps a tenant's counter equal to what it
holds, alone and under concurrent writers and acks, on one node and on the Citus cluster;
and the quota check reads the counter, not the messages."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel.errors import QuotaExceeded
from relay_services import Outbox

RELAY = "counts"


def counted_and_held(dsn: str, tenant: uuid.UUID) -> tuple[int, int]:
    """The sum of the tenant's slots, and its pending messages counted (as a superuser,
    whom row-level security does not filter)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select (select coalesce(sum(pending), 0) from keel.pending_message_counts"
            "  where tenant_id = %s),"
            " (select count(*) from keel.outbox where tenant_id = %s and state = 'pending')",
            (tenant, tenant),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def limited(dsn: str, limit: int | None = None) -> tuple[Outbox, str]:
    """A tenant to write messages with (and its own limit of pending messages, if given),
    and a topic prefix of its own."""
    ob = Outbox.make(dsn)
    if limit is not None:
        with psycopg.connect(dsn, autocommit=True) as su:
            su.execute(
                "select keel.set_tenant_quota(%s, 'max_tenant_pending_messages', %s)",
                (ob.tenant, limit),
            )
    return ob, f"counts{uuid.uuid4().hex[:8]}."


def in_step(dsn: str, tenant: uuid.UUID, expected: int) -> None:
    assert counted_and_held(dsn, tenant) == (expected, expected)


def claim(
    conn: psycopg.Connection, prefix: str, lease: str = "1 hour"
) -> list[tuple[uuid.UUID, int]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            "select message_id, claim_token from keel.claim_outbox(%s, 100, %s::interval, %s)",
            (RELAY, lease, prefix),
        )
    ]


def every_path(dsn: str) -> None:
    ob, prefix = limited(dsn)
    ob.commit(f"{prefix}a", list(range(6)))
    in_step(dsn, ob.tenant, 6)
    with psycopg.connect(dsn, autocommit=True) as relay:
        claims = claim(relay, prefix)
        assert len(claims) == 6
        items = [
            {"tenant_id": str(ob.tenant), "message_id": str(m), "claim_token": t}
            for m, t in claims[:2]
        ]
        refused = relay.execute(
            "select count(*) from keel.ack_outbox_messages(%s::jsonb)"
            " where refused_sqlstate is not null",
            (json.dumps(items),),
        ).fetchone()
        assert refused is not None and refused[0] == 0
        in_step(dsn, ob.tenant, 4)
        # acked again: delivered before with this token, no second count
        relay.execute("select * from keel.ack_outbox_messages(%s::jsonb)", (json.dumps(items),))
        (single, single_token), (backoff, backoff_token) = claims[2], claims[3]
        (dead, dead_token), (released, released_token) = claims[4], claims[5]
        relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, single, single_token))
        relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, single, single_token))
        in_step(dsn, ob.tenant, 3)
        relay.execute(
            "select keel.nack_outbox(%s, %s, %s, 'later')", (ob.tenant, backoff, backoff_token)
        )
        relay.execute(
            "select keel.nack_outbox(%s, %s, %s, 'refused', true)", (ob.tenant, dead, dead_token)
        )
        relay.execute(
            "select keel.release_outbox(%s, %s, %s)", (ob.tenant, released, released_token)
        )
        in_step(dsn, ob.tenant, 2)
        relay.execute("select keel.relay_replay_outbox(%s, %s)", (ob.tenant, dead))
        in_step(dsn, ob.tenant, 3)

        # Deaths: a claim finds messages claimed outbox_max_unreported_claims times
        # with no ack or nack, and makes them dead.
        relay.execute(
            "update keel.settings set value = '1' where setting = 'outbox_max_unreported_claims'"
        )
        first = claim(relay, prefix, "1 millisecond")
        assert {released, dead} <= {m for m, _ in first}

        def states() -> set[str]:
            with psycopg.connect(dsn, autocommit=True) as su:
                return {
                    r[0]
                    for r in su.execute(
                        "select state from keel.outbox where tenant_id = %s"
                        " and message_id = any(%s)",
                        (ob.tenant, [released, dead]),
                    )
                }

        # Claimed once, their claims expired: the next claims make them dead (the message
        # backing off may be claimed meanwhile, and die the same way).
        deadline = time.monotonic() + 60
        while states() != {"dead"} and time.monotonic() < deadline:
            claim(relay, prefix, "1 millisecond")
            time.sleep(0.01)
        assert states() == {"dead"}
        counted, held = counted_and_held(dsn, ob.tenant)
        assert counted == held <= 1

        # The owner removes a pending message by hand: the counter is one over until
        # something counts again.
        [fresh] = ob.commit(f"{prefix}a", ["fresh"])
        relay.execute(
            "delete from keel.outbox where tenant_id = %s and message_id = %s", (ob.tenant, fresh)
        )
        assert counted_and_held(dsn, ob.tenant) == (held + 1, held)
        recounted = relay.execute(
            "select keel.recount_pending_messages(%s)", (ob.tenant,)
        ).fetchone()
        assert recounted is not None and recounted[0] == held
        in_step(dsn, ob.tenant, held)


def test_every_way_in_and_out_of_pending_keeps_the_counter_in_step(migrated_db):
    """Writes, a batch of acks (and the same batch again), single acks (twice), a nack
    that backs off, one that kills, a release, a replay, deaths by unreported claims, and
    a message the owner deletes by hand, then keel.recount_pending_messages: after each,
    the tenant's slots add up to its pending messages. Fails on a schema where any of them
    leaves the counter behind (or counts twice)."""
    every_path(migrated_db)


def test_on_citus_every_way_in_and_out_of_pending_keeps_the_counter_in_step(citus_keel):
    """every_path on the Citus cluster: the counter's slots live with the tenant's shard,
    written by the delegated calls there."""
    every_path(citus_keel)


def two_recounts_at_once(dsn: str) -> None:
    limit = 24
    ob, prefix = limited(dsn, limit)
    ob.commit(f"{prefix}w", list(range(limit)))
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute(
            "delete from keel.outbox where tenant_id = %s and position <= %s",
            (ob.tenant, limit // 2),
        )
    assert counted_and_held(dsn, ob.tenant) == (limit, limit // 2)
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        first, second = Keel(a), Keel(b)
        task_a = first.create_task(ob.tenant, ob.workflow, 1)
        task_b = second.create_task(ob.tenant, ob.workflow, 1)
        with first.transaction(ob.tenant):
            # A's recount folds the 12 under the base row's lock, held to its commit.
            first.transition_task(
                ob.tenant, task_a.task_id, 1, "done", outbox=[{"topic": f"{prefix}a"}] * 3
            )
            # B's recount, meanwhile, finds the base row locked: it decides on its own
            # count without waiting (a lock timeout would fail it) and folds nothing.
            b.execute("set lock_timeout = '5s'")
            second.transition_task(
                ob.tenant, task_b.task_id, 1, "done", outbox=[{"topic": f"{prefix}b"}] * 3
            )
    assert counted_and_held(dsn, ob.tenant) == (limit // 2 + 6, limit // 2 + 6)


def test_two_recounts_at_once_fold_the_error_once(migrated_db):
    """The counter is 12 over (messages the owner deleted by hand) and a tenant's limit is
    reached on it: writer A's transition recounts and stays open, writer B's recounts
    meanwhile without waiting for A. Once both committed, the counter equals what the
    tenant holds. Fails on a recount that folds without the base row's lock (12 under) or
    waits for it (B's lock timeout)."""
    two_recounts_at_once(migrated_db)


def test_on_citus_two_recounts_at_once_fold_the_error_once(citus_keel):
    """two_recounts_at_once on the Citus cluster."""
    two_recounts_at_once(citus_keel)


def racing_writers_and_a_relay(dsn: str) -> None:
    limit = 24
    ob, prefix = limited(dsn, limit)
    # At the limit, then half of it removed by hand: the counter is 12 over, and the
    # racing writers' first recounts must fold that once, not once each.
    ob.commit(f"{prefix}w", list(range(limit)))
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute(
            "delete from keel.outbox where tenant_id = %s and topic = %s and position <= %s",
            (ob.tenant, f"{prefix}w", limit // 2),
        )
    assert counted_and_held(dsn, ob.tenant) == (limit, limit // 2)
    writers, rounds = 4, 15
    outcomes: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(rounds):
                    try:
                        ob.commit(f"{prefix}w", [1, 2, 3], conn=conn)
                        outcomes.append("written")
                    except QuotaExceeded:
                        outcomes.append("refused")
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def deliver() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while True:
                    finished = done.is_set()
                    claims = claim(conn, prefix)
                    items = [
                        {"tenant_id": str(ob.tenant), "message_id": str(m), "claim_token": t}
                        for m, t in claims
                    ]
                    if items:
                        conn.execute(
                            "select * from keel.ack_outbox_messages(%s::jsonb)",
                            (json.dumps(items),),
                        )
                    elif finished:
                        return
                    else:
                        time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    relay = threading.Thread(target=deliver)
    for t in [*threads, relay]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    relay.join()
    assert errors == []
    assert len(outcomes) == writers * rounds
    assert "written" in outcomes
    in_step(dsn, ob.tenant, 0)


def test_racing_writers_near_the_limit_and_a_relay_leave_the_counter_in_step(migrated_db):
    """Four writers of one tenant (3 messages a transition, a limit of 24, so recounts and
    refusals happen all the time) race a relay that claims and acks in batches, starting
    from a counter 12 over (messages the owner deleted by hand); once all is delivered,
    the slots add up to zero. Fails on a recount that folds one error twice (without the
    base row's lock) or loses a concurrent writer's addition."""
    racing_writers_and_a_relay(migrated_db)


def test_on_citus_racing_writers_near_the_limit_and_a_relay_leave_the_counter_in_step(
    citus_keel,
):
    """racing_writers_and_a_relay on the Citus cluster."""
    racing_writers_and_a_relay(citus_keel)


@pytest.mark.parametrize("pending", [2000])
def test_the_quota_check_reads_the_counter_not_the_pending_messages(migrated_db, pending):
    """With 2,000 messages pending, a transition that writes one more reads a handful of
    outbox rows (pg_stat_xact_user_tables), not the 2,000. Fails on a schema that counts
    the pending messages on every write (it reads each of them)."""
    ob = Outbox.make(migrated_db)
    prefix = f"counts{uuid.uuid4().hex[:8]}."
    for _ in range(pending // 500):
        ob.commit(f"{prefix}backlog", list(range(500)))
    with psycopg.connect(migrated_db, autocommit=True) as conn, conn.transaction():
        reads = (
            "select coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)"
            " from pg_stat_xact_user_tables where relid = 'keel.outbox'::regclass"
        )
        keel = Keel(conn)
        task = keel.create_task(ob.tenant, ob.workflow, 1)
        before = conn.execute(reads).fetchone()
        keel.transition_task(ob.tenant, task.task_id, 1, "done", outbox=[{"topic": f"{prefix}one"}])
        after = conn.execute(reads).fetchone()
    assert before is not None and after is not None
    read = after[0] - before[0]
    assert read < 50, f"a transition read {read} outbox rows with {pending} pending"


def test_a_tenant_that_held_messages_before_the_counter_is_counted_in_full(migrated_db):
    """Migration 0047 counts nothing (under forced row-level security it would see no
    tenant's rows): a tenant made before it has no counter rows, and its first write that
    checks the quota counts what it holds and makes its base. Five messages pending, the
    counter's rows removed (an install upgraded to 0047), a limit of 6: one more is
    accepted, the counter then holds 6, and the next is refused."""
    ob, prefix = limited(migrated_db)
    ob.commit(f"{prefix}old", list(range(5)))
    with psycopg.connect(migrated_db, autocommit=True) as su:
        su.execute("delete from keel.pending_message_counts where tenant_id = %s", (ob.tenant,))
        su.execute(
            "select keel.set_tenant_quota(%s, 'max_tenant_pending_messages', 6)", (ob.tenant,)
        )
    assert counted_and_held(migrated_db, ob.tenant) == (0, 5)
    ob.commit(f"{prefix}new", [1])
    in_step(migrated_db, ob.tenant, 6)
    with pytest.raises(QuotaExceeded):
        ob.commit(f"{prefix}new", [2])
    in_step(migrated_db, ob.tenant, 6)


def test_serializable_writers_that_would_pass_the_limit_together_fail_one_with_40001(
    migrated_db,
):
    """docs/security.md: in SERIALIZABLE, two transactions of one tenant that each write
    within the limit but together pass it cannot both commit; one fails with 40001. A
    limit of 4, two open transactions writing 3 each: one commits, the other fails with
    serialization_failure, and the counter holds 3."""
    ob, prefix = limited(migrated_db, 4)
    outbox = [{"topic": f"{prefix}s"}] * 3
    failures: list[str] = []
    with (
        psycopg.connect(migrated_db, autocommit=True) as a,
        psycopg.connect(migrated_db, autocommit=True) as b,
    ):
        tasks = [Keel(c).create_task(ob.tenant, ob.workflow, 1) for c in (a, b)]
        for conn in (a, b):
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        try:
            with a.transaction():
                Keel(a).transition_task(ob.tenant, tasks[0].task_id, 1, "done", outbox=outbox)
                try:
                    with b.transaction():
                        Keel(b).transition_task(
                            ob.tenant, tasks[1].task_id, 1, "done", outbox=outbox
                        )
                except psycopg.errors.SerializationFailure:
                    failures.append("b")
        except psycopg.errors.SerializationFailure:
            failures.append("a")
    assert len(failures) == 1
    in_step(migrated_db, ob.tenant, 3)


def no_writer_waits_for_a_held_slot(dsn: str) -> None:
    ob, prefix = limited(dsn)
    for _ in range(3):
        ob.commit(f"{prefix}w", [1, 2])
    with psycopg.connect(dsn, autocommit=True) as holder, holder.transaction():
        # Every slot row the tenant has, held as an open writer would hold its own.
        held = holder.execute(
            "select slot from keel.pending_message_counts where tenant_id = %s and slot > 0"
            " for update",
            (ob.tenant,),
        ).fetchall()
        assert held
        with psycopg.connect(dsn, autocommit=True) as writer:
            writer.execute("set lock_timeout = '5s'")
            ob.commit(f"{prefix}w", [3], conn=writer)
    in_step(dsn, ob.tenant, 7)


def test_a_writer_takes_a_free_slot_when_every_slot_is_held(migrated_db):
    """Another transaction holds every slot row of the tenant's counter (open writers each
    hold theirs to commit); a new transition still writes its message at once, in a new
    slot, and the counter is right. Fails on a counter whose writer waits for its own slot
    (lock timeout)."""
    no_writer_waits_for_a_held_slot(migrated_db)


def test_on_citus_a_writer_takes_a_free_slot_when_every_slot_is_held(citus_keel):
    """no_writer_waits_for_a_held_slot on the Citus cluster."""
    no_writer_waits_for_a_held_slot(citus_keel)


def open_writers_make_no_other_wait(dsn: str) -> None:
    ob, prefix = limited(dsn)
    with psycopg.connect(dsn, autocommit=True) as su:
        slots = su.execute(
            "select count(*) from keel.pending_message_counts where tenant_id = %s", (ob.tenant,)
        ).fetchone()
    assert slots == (17,)  # the base and 16 slots, made with the tenant
    with contextlib.ExitStack() as stack:
        for n in range(6):  # writers that keep their transactions open
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
            stack.enter_context(conn.transaction())
            ob.commit(f"{prefix}open", [n], conn=conn)
        for n in range(12):  # each would wait for a slot an open one holds, if it could
            with psycopg.connect(dsn, autocommit=True) as writer:
                writer.execute("set lock_timeout = '2s'")
                ob.commit(f"{prefix}w", [n], conn=writer)
    in_step(dsn, ob.tenant, 18)


def test_writers_that_keep_their_transactions_open_make_no_other_writer_wait(migrated_db):
    """A new tenant has its counter's base and 16 slots. Six writers keep their
    transactions open after writing a message; twelve more write one each, with a lock
    timeout, and none waits (whatever their backends' numbers). Fails on a counter whose
    writer makes its slot when the tenant's first writes come (two backends with one
    number meet on it)."""
    open_writers_make_no_other_wait(migrated_db)


def test_on_citus_writers_that_keep_their_transactions_open_make_no_other_writer_wait(
    citus_keel,
):
    """open_writers_make_no_other_wait on the Citus cluster."""
    open_writers_make_no_other_wait(citus_keel)
