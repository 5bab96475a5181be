"""Per-key heads of the outbox (migrations 0037 and 0038): a keyed message written behind a
pending message of its key is held out of the claim index, so a claim reads none of the
backlog behind an in-flight message; the relay's sweep promotes the held messages no
retirement saw. Nothing here waits on anybody: writers, acks and sweeps take no lock the
others wait for."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

import citus_cluster
from agentkeel.client import Keel, set_tenant_context
from agentkeel.sql_files import sql_root
from relay_services import Outbox, run_relay

BACKLOG = 5000
TUPLES = (
    "select coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)"
    " from pg_stat_xact_user_tables where relid = 'keel.outbox'::regclass"
)


def topic() -> str:
    return f"heads{uuid.uuid4().hex[:8]}"


def claim(conn: psycopg.Connection, prefix: str, limit: int = 100) -> list[tuple[uuid.UUID, int]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            "select message_id, claim_token from keel.claim_outbox('heads', %s, '1 hour', %s)",
            (limit, prefix),
        )
    ]


def held(ob: Outbox) -> dict[str, bool]:
    return {str(r["message_id"]): r["held"] for r in ob.rows() if r["state"] == "pending"}


def test_a_claim_reads_none_of_the_messages_held_behind_a_key(migrated_db):
    """5,000 messages of two keys wait behind their keys' in-flight heads; claiming one
    other message reads a few outbox rows, not the backlog. Fails on a schema whose claim
    asks of every due message whether an earlier one of its key is pending (it reads every
    held-back row: thousands of tuples)."""
    ob, name = Outbox.make(migrated_db), topic()
    for _ in range(5):
        ob.commit(f"{name}.backlog", list(range(BACKLOG // 5)), keys=["a", "b"] * (BACKLOG // 10))
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        heads = claim(conn, f"{name}.backlog")
        assert len(heads) == 2  # one per key; the rest wait behind them
        ob.commit(f"{name}.other", [{"n": 1}])
        conn.execute("analyze keel.outbox")
        with conn.transaction():
            before = conn.execute(TUPLES).fetchone()[0]
            assert len(claim(conn, f"{name}.other")) == 1
            read = conn.execute(TUPLES).fetchone()[0] - before
    assert read < 100, f"the claim read {read} outbox rows with {BACKLOG - 2} held back"
    assert sum(held(ob).values()) == BACKLOG - 2


def test_a_message_written_while_its_head_is_acked_is_promoted_by_the_sweep(migrated_db):
    """The writer sees the head pending and holds its message; the ack commits first and
    cannot see the message yet. No lock orders the two, so the message is held with nothing
    before it: the sweep makes it claimable, and per-key order holds."""
    ob, name = Outbox.make(migrated_db), topic()
    [head] = ob.commit(f"{name}.k", [{"n": 1}], keys=["k"])
    with psycopg.connect(migrated_db, autocommit=True) as relay:
        [(claimed, token)] = claim(relay, f"{name}.")
        assert str(claimed) == head
        # the writer's transaction stays open until the ack has committed
        with psycopg.connect(migrated_db, autocommit=True) as writer, writer.transaction():
            [late] = ob.commit(f"{name}.k", [{"n": 2}], conn=writer, keys=["k"])
            relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, claimed, token))
        assert held(ob) == {late: True}
        assert claim(relay, f"{name}.") == []  # held: not in the claim index
        assert Keel(relay).sweep_outbox_heads() >= 1  # the whole sweep, as --once runs it
        assert held(ob) == {late: False}
        assert [str(m) for m, _ in claim(relay, f"{name}.")] == [late]


def test_the_relay_delivers_a_message_whose_head_was_deleted(migrated_db, tmp_path: Path):
    """The owner deletes a key's pending head (its task, by cascade): no retirement
    promotes the message behind it; `relay --once` sweeps before it stops and delivers it."""
    ob, name = Outbox.make(migrated_db), topic()
    ob.commit(f"{name}.k", [{"n": 1}], keys=["k"])
    [second] = ob.commit(f"{name}.k", [{"n": 2}], keys=["k"])
    with psycopg.connect(migrated_db, autocommit=True) as su, su.transaction():
        set_tenant_context(su, ob.tenant)
        su.execute("set local keel.purge = on")
        su.execute(
            "delete from keel.tasks where tenant_id = %s and task_id ="
            " (select task_id from keel.outbox where tenant_id = %s and topic = %s"
            " order by created_at limit 1)",
            (ob.tenant, ob.tenant, f"{name}.k"),
        )
    assert held(ob) == {second: True}
    sink = tmp_path / "out.jsonl"
    done = run_relay(migrated_db, f"file:{sink}", "--once", "--topic-prefix", f"{name}.")
    assert done.returncode == 0, done.stderr
    assert second in sink.read_text()
    assert held(ob) == {}


def test_writers_and_acks_of_one_key_never_wait_on_each_other(migrated_db):
    """A writer holds its transaction open after writing to a key (an agent thinking);
    meanwhile the relay acks and claims that key's messages and the sweep runs. None of
    them waits: each would block on a lock the writer held if one were taken."""
    ob, name = Outbox.make(migrated_db), topic()
    ob.commit(f"{name}.k", [{"n": 1}, {"n": 2}], keys=["k", "k"])
    with (
        psycopg.connect(migrated_db, autocommit=True) as writer,
        psycopg.connect(migrated_db, autocommit=True) as relay,
    ):
        relay.execute("set statement_timeout = '20s'")
        with writer.transaction():  # open while the relay works on the key
            ob.commit(f"{name}.k", [{"n": 3}], conn=writer, keys=["k"])
            for _ in range(2):
                [(message, token)] = claim(relay, f"{name}.")
                relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, message, token))
            relay.execute("select * from keel.promote_outbox_heads()")
            assert claim(relay, f"{name}.") == []  # the third is not committed yet
        relay.execute("select * from keel.promote_outbox_heads()")
        assert len(claim(relay, f"{name}.")) == 1


def backfill() -> str:
    """Migration 0038's backfill, as the file holds it."""
    text = (sql_root() / "schema/0038_outbox_claimable_idx.sql").read_text()
    match = re.search(r"^do \$\$.*?^\$\$;", text, re.S | re.M)
    assert match, "schema/0038_outbox_claimable_idx.sql has no DO block"
    return match.group(0)


def test_the_upgrade_holds_all_but_the_oldest_pending_message_of_each_key(migrated_db):
    """Run as a migrator login that is not a superuser (row-level security forced on the
    outbox), migration 0038 keeps the oldest pending message of each key claimable and
    holds the rest, so an upgraded backlog costs a claim nothing either."""
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(migrated_db, autocommit=True) as su:
        keel = Keel(su)
        keel.create_tenant("heads-a", a)
        keel.create_tenant("heads-b", b)
        rows = [  # (tenant, key, state, minutes ago)
            (a, "k", "pending", 9),
            (a, "k", "pending", 8),
            (a, "k", "delivered", 10),
            (a, "k", "pending", 7),
            (a, "j", "pending", 5),
            (b, "k", "pending", 4),
            (b, "k", "pending", 3),
            (b, None, "pending", 2),
        ]
        made: dict[tuple[uuid.UUID, str | None, int], uuid.UUID] = {}
        for tenant, key, state, ago in rows:
            with su.transaction():
                set_tenant_context(su, tenant)
                [message_id] = su.execute(
                    "insert into keel.outbox (tenant_id, topic, message_key, payload, state,"
                    " delivered_at, created_at)"
                    " values (%s, 'heads.upgrade', %s, '{}', %s,"
                    " case when %s = 'delivered' then now() end, now() - %s)"
                    " returning message_id",
                    (tenant, key, state, state, timedelta(minutes=ago)),
                ).fetchone()
            made[(tenant, key, ago)] = message_id
        migrator = f"akt_heads_{uuid.uuid4().hex[:8]}"
        su.execute(
            sql.SQL("create role {} login in role keel_owner").format(sql.Identifier(migrator))
        )
    try:
        with psycopg.connect(conninfo.make_conninfo(migrated_db, user=migrator)) as conn:
            assert conn.execute(
                "select rolsuper from pg_roles where rolname = current_user"
            ).fetchone() == (False,)
            conn.execute(backfill())
            conn.commit()
        with psycopg.connect(migrated_db, autocommit=True) as su:
            flags = dict(
                su.execute(
                    "select message_id, held from keel.outbox where tenant_id in (%s, %s)", (a, b)
                ).fetchall()
            )
            claimed = {m for m, _ in claim(su, "heads.upgrade")}
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as su:
            su.execute(sql.SQL("drop role {}").format(sql.Identifier(migrator)))
            for tenant in (a, b):
                with su.transaction():
                    set_tenant_context(su, tenant)
                    su.execute("set local keel.purge = on")
                    su.execute("delete from keel.tenants where tenant_id = %s", (tenant,))
    assert {key: flags[m] for key, m in made.items()} == {
        (a, "k", 9): False,
        (a, "k", 8): True,
        (a, "k", 10): False,  # delivered: not pending, never held
        (a, "k", 7): True,
        (a, "j", 5): False,
        (b, "k", 4): False,
        (b, "k", 3): True,
        (b, None, 2): False,
    }
    assert claimed == {made[(a, "k", 9)], made[(a, "j", 5)], made[(b, "k", 4)], made[(b, None, 2)]}


def test_writers_racing_the_relay_on_their_keys_keep_order_and_leave_nothing(
    migrated_db, tmp_path: Path
):
    """Four writers each commit 25 messages to a key of their own while relays deliver and
    ack that key's messages: whatever `held` each write decided against an ack running at
    the same moment, each key arrives in order and nothing stays behind."""
    ob, name = Outbox.make(migrated_db), topic()
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            with psycopg.connect(migrated_db, autocommit=True) as conn:
                for i in range(25):
                    ob.commit(f"{name}.k", [{"i": i}], conn=conn, keys=[f"k{worker}"])
        except BaseException as error:  # reported below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    sink = tmp_path / "out.jsonl"
    for t in writers:
        t.start()
    while any(t.is_alive() for t in writers):
        run_relay(migrated_db, f"file:{sink}", "--once", "--topic-prefix", f"{name}.")
    for t in writers:
        t.join()
    assert not errors, errors
    done = run_relay(migrated_db, f"file:{sink}", "--once", "--topic-prefix", f"{name}.")
    assert done.returncode == 0, done.stderr
    assert {r["state"] for r in ob.rows()} == {"delivered"}
    delivered = [json.loads(line) for line in sink.read_text().splitlines()]
    for worker in range(4):
        payloads = [d["payload"]["i"] for d in delivered if d["key"] == f"k{worker}"]
        assert payloads == list(range(25)), (worker, payloads)


def test_serializable_writers_of_one_key_keep_its_order_when_one_is_retried(migrated_db):
    """Two SERIALIZABLE transactions write a message of the same key at once. The held
    check does not read under SERIALIZABLE, but the tenant's pending-message quota does (a
    quota a caller could lift by choosing its isolation level would be none), so the two
    may form a read/write cycle: at most one fails with 40001 and, retried alone, commits.
    Their messages are claimed one at a time, in order of commit."""
    ob, name = Outbox.make(migrated_db), topic()
    failed: list[int] = []
    with (
        psycopg.connect(migrated_db, autocommit=True) as one,
        psycopg.connect(migrated_db, autocommit=True) as two,
    ):
        writers = [(conn, Keel(conn)) for conn in (one, two)]
        tasks = [keel.create_task(ob.tenant, ob.workflow, 1) for _, keel in writers]

        def transition(n: int) -> None:
            writers[n][1].transition_task(
                ob.tenant,
                tasks[n].task_id,
                1,
                "done",
                outbox=[{"topic": f"{name}.k", "key": "k", "payload": {"n": n}}],
            )

        for conn, _ in writers:
            conn.execute("begin isolation level serializable")
        for n in (0, 1):  # both written before either commits
            try:
                transition(n)
            except psycopg.errors.SerializationFailure:
                failed.append(n)
        for n, (conn, _) in enumerate(writers):
            try:
                conn.execute("rollback" if n in failed else "commit")
            except psycopg.errors.SerializationFailure:
                failed.append(n)
        for n in failed:
            with writers[n][0].transaction():
                writers[n][0].execute("set transaction isolation level serializable")
                transition(n)
    assert len(failed) <= 1
    order = [n for n in (0, 1) if n not in failed] + failed
    with psycopg.connect(migrated_db, autocommit=True) as relay:
        [(claimed, token)] = claim(relay, f"{name}.")
        relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, claimed, token))
        [(second, _)] = claim(relay, f"{name}.")
    payloads = {str(r["message_id"]): r["payload"] for r in ob.rows()}
    assert [payloads[str(claimed)], payloads[str(second)]] == [{"n": n} for n in order]


def test_the_old_claim_index_goes_only_once_the_new_ones_are_valid(migrated_db):
    """Migration 0038 run again after an interrupted concurrent build: `if not exists`
    takes the INVALID index for done, and the file's guard stops before the old index is
    dropped, naming the index and what to do."""
    text = (sql_root() / "schema/0038_outbox_claimable_idx.sql").read_text()
    guard = re.findall(r"^do \$\$.*?^\$\$;", text, re.S | re.M)[1]
    with psycopg.connect(migrated_db) as su:
        su.execute(
            "update pg_index set indisvalid = false"
            " where indexrelid = 'keel.outbox_claimable_idx'::regclass"
        )
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as info:
            su.execute(guard)
        su.rollback()
    assert "keel.outbox_claimable_idx is INVALID" in str(info.value)
    assert "drop index concurrently" in (info.value.diag.message_hint or "")


def test_messages_that_writers_wrote_at_once_are_held_by_the_first_claim_that_finds_them(
    migrated_db,
):
    """Writers in transactions open at the same time each see none of the others' messages,
    so none of theirs is held: 5 writers x 100 keys leave 400 messages claimable behind
    another of their key. The first claim that reads them holds them, so the next claim
    reads none of them (the count of outbox rows a claim reads, as above)."""
    ob, name = Outbox.make(migrated_db), topic()
    writers = [psycopg.connect(migrated_db, autocommit=True) for _ in range(5)]
    try:
        opened = [w.transaction() for w in writers]
        for tx in opened:
            tx.__enter__()
        for w in writers:
            ob.commit(f"{name}.k", list(range(100)), conn=w, keys=[f"k{i}" for i in range(100)])
        for tx in opened:
            tx.__exit__(None, None, None)
    finally:
        for w in writers:
            w.close()
    assert sum(held(ob).values()) == 0
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        heads = claim(conn, f"{name}.k", limit=1000)
        assert len(heads) == 100  # one per key; the other 400 are now held
        assert sum(held(ob).values()) == 400
        ob.commit(f"{name}.other", [{"n": 1}])
        with conn.transaction():
            before = conn.execute(TUPLES).fetchone()[0]
            assert len(claim(conn, f"{name}.other")) == 1
            read = conn.execute(TUPLES).fetchone()[0] - before
    assert read < 100, f"the claim read {read} outbox rows"


CLAIM_INDEX_READS = "select pg_stat_get_xact_tuples_returned('keel.outbox_claimable_idx'::regclass)"


def backlog_behind_a_head_in_backoff(migrated_db: str, ob: Outbox, name: str, count: int) -> None:
    """`count` messages of key k, none held (written in a SERIALIZABLE transaction, which
    does not look), behind a head that a relay claimed and nacked into a long backoff."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        [head] = ob.commit(f"{name}.k", [{"n": 0}], keys=["k"])
        conn.execute("set default_transaction_isolation = 'serializable'")
        for start in range(0, count, 1000):  # settings.max_transition_messages a transition
            size = min(1000, count - start)
            ob.commit(f"{name}.k", list(range(size)), conn=conn, keys=["k"] * size)
        conn.execute("set default_transaction_isolation = 'read committed'")
        [(claimed, token)] = claim(conn, f"{name}.", limit=1)
        assert str(claimed) == head
        conn.execute(
            "update keel.settings set value = '1 hour' where setting = 'outbox_backoff_base'"
        )
        try:
            conn.execute(
                "select keel.nack_outbox(%s, %s, %s, 'refused')", (ob.tenant, claimed, token)
            )
        finally:
            conn.execute(
                "update keel.settings set value = '1 second' where setting = 'outbox_backoff_base'"
            )
    assert sum(held(ob).values()) == 0


def test_a_claim_walks_the_claim_index_once_however_many_messages_it_holds(migrated_db):
    """3,000 messages of one key wait unheld behind a head in backoff. A claim of one
    message holds them all in rounds of one, each round after the last in the claim index,
    so it reads each index entry about once (with every round starting from the beginning
    it read 4.5 million: three thousand rounds past the entries of the ones before)."""
    ob, name = Outbox.make(migrated_db), topic()
    backlog_behind_a_head_in_backoff(migrated_db, ob, name, 3000)
    with psycopg.connect(migrated_db, autocommit=True) as conn, conn.transaction():
        before = conn.execute(CLAIM_INDEX_READS).fetchone()[0]
        assert claim(conn, f"{name}.", limit=1) == []
        read = conn.execute(CLAIM_INDEX_READS).fetchone()[0] - before
    assert sum(held(ob).values()) == 3000
    assert read < 3 * 3000, f"the claim read {read} claim index entries"


def test_a_claim_death_lets_the_same_claim_take_the_next_message_of_its_key(migrated_db):
    """The head of key k has had its last unreported claim: the claim that finds it marks
    it dead, which makes the next message of k claimable, and returns that message in the
    same call (a relay with --once would otherwise stop with it due)."""
    ob, name = Outbox.make(migrated_db), topic()
    first, second, third = ob.commit(f"{name}.k", [1, 2, 3], keys=["k"] * 3)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        with conn.transaction():
            set_tenant_context(conn, ob.tenant)
            conn.execute("set local keel.outbox_delivery = on")
            conn.execute(
                "update keel.outbox set claims = (select value::integer from keel.settings"
                " where setting = 'outbox_max_unreported_claims') where message_id = %s",
                (first,),
            )
        assert [str(m) for m, _ in claim(conn, f"{name}.")] == [second]
    states = {str(r["message_id"]): (r["state"], r["held"]) for r in ob.rows()}
    assert states == {
        first: ("dead", False),
        second: ("pending", False),
        third: ("pending", True),
    }


def test_a_message_behind_one_in_flight_is_left_unheld_for_its_ack(migrated_db):
    """A relay holds the head of key k; a second message of k was written unheld (its
    writer's transaction overlapped the head's). Another relay's claim passes it without
    holding it: the head's ack, which may commit first, would not see it held and would
    promote nothing. Once the head is acked the message is claimed."""
    ob, name = Outbox.make(migrated_db), topic()
    with (
        psycopg.connect(migrated_db, autocommit=True) as one,
        psycopg.connect(migrated_db, autocommit=True) as two,
        one.transaction(),
    ):
        [head] = ob.commit(f"{name}.k", [{"n": 1}], conn=one, keys=["k"])
        with two.transaction():
            [second] = ob.commit(f"{name}.k", [{"n": 2}], conn=two, keys=["k"])
    with (
        psycopg.connect(migrated_db, autocommit=True) as relay1,
        psycopg.connect(migrated_db, autocommit=True) as relay2,
    ):
        [(claimed, token)] = claim(relay1, f"{name}.", limit=1)
        assert str(claimed) == head
        assert claim(relay2, f"{name}.") == []
        assert held(ob) == {head: False, second: False}
        relay1.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, claimed, token))
        assert [str(m) for m, _ in claim(relay2, f"{name}.")] == [second]


@contextlib.contextmanager
def claims_stopped_at_their_first_row(dsn: str) -> Iterator[Callable[[int], bool]]:
    """A trigger on the outbox (on Citus: on every shard of it, on each worker) that makes
    a claim by the relay 'gated' wait on an advisory lock, held here on every node until
    the block ends. Yields a test of whether a backend waits at the gate: the backend
    itself on one node; on Citus, any backend of the workers (where the claim's updates
    run)."""
    gate = int(uuid.uuid4().int % 2**62)
    fn = f"akt_gate_{uuid.uuid4().hex[:8]}"
    function = sql.SQL(
        "create function public.{fn}() returns trigger language plpgsql as $f$"
        " begin perform pg_advisory_lock({gate}); perform pg_advisory_unlock({gate});"
        " return new; end $f$"
    ).format(fn=sql.Identifier(fn), gate=sql.Literal(gate))
    trigger = (
        f"create trigger {fn} before update on %s for each row when"
        f" (new.claimed_by = 'gated' and old.claimed_by is null) execute function public.{fn}()"
    )
    dbname = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(dsn, autocommit=True) as su:
        citus = su.execute(
            "select exists (select 1 from pg_extension where extname = 'citus')"
        ).fetchone()[0]
        workers = citus_cluster.nodes(dsn)[1:] if citus else []
        gates = [
            psycopg.connect(citus_cluster.node_dsn(dsn, w, dbname), autocommit=True)
            for w in workers
        ] or [psycopg.connect(dsn, autocommit=True)]
        try:
            su.execute(function)  # Citus creates it on the workers too
            if citus:
                made = su.execute(
                    "select success, result from run_command_on_shards('keel.outbox', %s)",
                    (trigger,),
                ).fetchall()
                assert all(ok for ok, _ in made), made
            else:
                su.execute(trigger.replace("%s", "keel.outbox"))
            for conn in gates:
                conn.execute("select pg_advisory_lock(%s)", (gate,))

            def waiting(pid: int) -> bool:
                query = (
                    "select exists (select 1 from pg_locks where not granted"
                    " and locktype = 'advisory' and objid = %s::bigint %% 4294967296"
                    + ("" if citus else " and pid = %s")
                    + ")"
                )
                return any(
                    c.execute(query, (gate,) if citus else (gate, pid)).fetchone()[0] for c in gates
                )

            yield waiting
        finally:
            for conn in gates:
                conn.execute("select pg_advisory_unlock_all()")
            if citus:
                su.execute(
                    "select run_command_on_shards('keel.outbox', %s)",
                    (f"drop trigger if exists {fn} on %s",),
                )
            else:
                su.execute(
                    sql.SQL("drop trigger if exists {} on keel.outbox").format(sql.Identifier(fn))
                )
            su.execute(sql.SQL("drop function if exists public.{}()").format(sql.Identifier(fn)))
            for conn in gates:
                conn.close()


def claimed_by_gated(relay: psycopg.Connection, name: str) -> list[tuple[uuid.UUID, int]]:
    return [
        (r[0], r[1])
        for r in relay.execute(
            "select message_id, claim_token from keel.claim_outbox('gated', 10, '1 hour', %s)",
            (f"{name}.",),
        )
    ]


def claim_two_writers_of_one_key(dsn: str) -> None:
    """Two writers of key k overlap: the one that started first (the older created_at)
    commits last, while a claim is between its rounds, after its first round took the
    other writer's message. The second round sees the older message with nothing pending
    before it, but the claim already holds a message of k: it is left for a later claim,
    so a claim never returns two messages of one key (a relay may send a batch's messages
    at once)."""
    ob, name = Outbox.make(dsn), topic()
    with (
        psycopg.connect(dsn, autocommit=True) as older_writer,
        psycopg.connect(dsn, autocommit=True) as relay,
        claims_stopped_at_their_first_row(dsn) as waiting,
    ):
        claimed: list[list[tuple[uuid.UUID, int]]] = []

        errors: list[BaseException] = []

        def claim_gated() -> None:
            try:
                claimed.append(claimed_by_gated(relay, name))
            except BaseException as error:  # reported below
                errors.append(error)

        claimer = threading.Thread(target=claim_gated)
        with older_writer.transaction():
            [older] = ob.commit(f"{name}.k", [{"n": 1}], conn=older_writer, keys=["k"])
            [newer] = ob.commit(f"{name}.k", [{"n": 2}], keys=["k"])
            claimer.start()
            while not waiting(relay.info.backend_pid):
                assert claimer.is_alive(), f"the claim ended before the gate: {errors or claimed}"
                time.sleep(0.02)
        # the older writer has committed; the claim goes on to its next round
    claimer.join()
    assert [str(m) for m, _ in claimed[0]] == [newer], "two messages of key k in one claim"
    with psycopg.connect(dsn, autocommit=True) as relay:
        [(_, token)] = claimed[0]
        relay.execute("select keel.ack_outbox(%s, %s, %s)", (ob.tenant, newer, token))
        assert [str(m) for m, _ in claim(relay, f"{name}.")] == [older]


def test_a_message_committed_during_a_claim_behind_one_it_claimed_waits_for_the_next_claim(
    migrated_db,
):
    """claim_two_writers_of_one_key on one node. Fails on a claim that checks only the
    messages before each one (it returns both)."""
    claim_two_writers_of_one_key(migrated_db)


def test_on_citus_a_claim_returns_one_message_of_a_key_when_its_writers_commit_out_of_order(
    citus_keel,
):
    """claim_two_writers_of_one_key on the Citus cluster (the claim's own variant there)."""
    claim_two_writers_of_one_key(citus_keel)
