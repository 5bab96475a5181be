"""`agentkeel relay` as a command: its refusals and exit codes, the stdout and file sinks,
structured logs, LISTEN wake-up, SIGTERM (finish, ack, release, exit 0), `relay status`."""

from __future__ import annotations

import json
import signal
import time
import uuid

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.relay.failpoints import parse
from agentkeel.relay.sinks import FileSink, HttpSink, NatsSink, StdoutSink, parse_sink
from conftest import run_agentkeel
from relay_services import Outbox, http_receiver, relay_env, run_relay, start_relay


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("-", StdoutSink),
        ("file:/tmp/out.jsonl", FileSink),
        ("file:///tmp/out.jsonl", FileSink),
        ("http://127.0.0.1:8080/hook", HttpSink),
        ("https://hooks.example.com/keel", HttpSink),
        ("nats://127.0.0.1:4222/keel.outbox", NatsSink),
        ("nats://127.0.0.1/keel", NatsSink),
    ],
)
def test_sink_urls(url, kind):
    assert isinstance(parse_sink(url), kind)


def test_a_nats_url_without_a_port_uses_4222():
    sink = parse_sink("nats://broker/keel.outbox")
    assert isinstance(sink, NatsSink)
    assert (sink.server, sink.prefix) == ("nats://broker:4222", "keel.outbox")


@pytest.mark.parametrize(
    "url",
    ["ftp://host/x", "nats://127.0.0.1:4222", "nats://h/a..b", "file:", "http:///x", "kafka"],
)
def test_a_bad_sink_url_is_one_line_and_exit_2(migrated_db, url):
    result = run_agentkeel("relay", "--dsn", migrated_db, "--sink", url, "--once")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentkeel: error: bad sink URL"), lines


def test_the_relay_needs_a_dsn_and_a_sink(monkeypatch):
    monkeypatch.delenv("AGENTKEEL_DSN", raising=False)
    no_dsn = run_agentkeel("relay", "--sink", "-", "--once")
    assert no_dsn.returncode == 2 and "needs a database" in no_dsn.stderr
    no_sink = run_agentkeel("relay", "--dsn", "postgresql://nobody@127.0.0.1:1/x", "--once")
    assert no_sink.returncode == 2 and "needs --sink" in no_sink.stderr


def test_a_database_without_the_schema_is_exit_8(db):
    result = run_agentkeel("relay", "--dsn", db, "--sink", "-", "--once")
    assert result.returncode == 8, result.stderr
    assert "agentkeel migrate up" in result.stderr


@pytest.mark.parametrize("group", ["keel_app", None])
def test_a_login_outside_keel_relay_is_refused_before_it_starts(migrated_db, group):
    """Not "relay started" and then a permission error on the first claim."""
    name = f"akt_notrelay_{uuid.uuid4().hex[:8]}"
    create = "create role {} login" + (f" in role {group}" if group else "")
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(sql.SQL(create).format(sql.Identifier(name)))
    try:
        dsn = conninfo.make_conninfo(migrated_db, user=name)
        result = run_agentkeel("relay", "--dsn", dsn, "--sink", "-", "--once")
        assert result.returncode == 7, result.stderr
        assert "relay started" not in result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"agentkeel: error: role {name} may not "), lines
        assert lines[0].endswith(
            f"the relay's login must be a member of keel_relay (grant keel_relay to {name})"
        ), lines
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def test_the_relay_claims_at_most_the_databases_batch_limit(migrated_db, tmp_path):
    """One batch limit, the database's settings.max_batch_items, for the relay as for every
    claim. A larger --batch is lowered to it, with a warning; so is the relay's batch when
    the setting is lowered while it runs (it does not die on the refused claim)."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("update keel.settings set value = '5' where setting = 'max_batch_items'")
        with pytest.raises(psycopg.Error) as refused:  # the claim itself, for any caller
            conn.execute("select * from keel.claim_outbox('akt-relay', 6)")
        assert refused.value.sqlstate == "22K01"
        assert "a claim takes 1 to 5 items, not 6" in str(refused.value)
    box = Outbox.make(migrated_db)
    box.commit("batch.limit", [{"n": n} for n in range(12)])
    once = run_agentkeel("relay", "--dsn", migrated_db, "--sink", "-", "--once", "--batch", "50")
    assert once.returncode == 0, once.stderr
    assert '"event": "batch lowered to settings.max_batch_items"' in once.stderr
    assert '"requested": 50, "batch": 5' in once.stderr
    assert box.states() == {"delivered": 12}
    # Lowered under a running relay: its next claim is refused, it fits and goes on.
    sink = tmp_path / "out.jsonl"
    relay = start_relay(migrated_db, f"file:{sink}", "--batch", "5", "--poll-interval", "0.2")
    try:
        assert relay.stderr is not None
        for line in relay.stderr:
            if '"event": "relay started"' in line:
                break
        else:
            pytest.fail("the relay ended without starting")
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute("update keel.settings set value = '2' where setting = 'max_batch_items'")
        sent = box.commit("batch.lowered", [{"n": n} for n in range(6)])
        box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=120)
        assert [json.loads(line)["message_id"] for line in sink.read_text().splitlines()] == sent
    finally:
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=60)
    assert relay.returncode == 0, stderr
    assert '"requested": 5, "batch": 2' in stderr


def test_an_unreachable_database_is_exit_6():
    result = run_agentkeel(
        "relay", "--dsn", "postgresql://nobody@127.0.0.1:1/x", "--sink", "-", "--once"
    )
    assert result.returncode == 6, result.stderr


def test_a_malformed_failpoint_is_refused(migrated_db):
    assert parse("after_claim:3,after_ack") == {"after_claim": 3, "after_ack": 1}
    result = run_relay(migrated_db, "-", "--once", failpoint="after_lunch")
    assert result.returncode == 2 and "AGENTKEEL_RELAY_FAILPOINT" in result.stderr


def test_stdout_sink_and_json_logs(migrated_db):
    box = Outbox.make(migrated_db)
    sent = box.commit("orders.created", [{"n": n} for n in range(5)])
    result = run_relay(migrated_db, "-", "--once", "--batch", "2", "--log-level", "debug")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["message_id"] for r in records] == sent
    assert {r["topic"] for r in records} == {"orders.created"}
    logs = [json.loads(line) for line in result.stderr.splitlines()]
    assert {"relay started", "batch", "relay stopped"} <= {entry["event"] for entry in logs}
    assert logs[-1]["acked"] == 5
    assert box.states() == {"delivered": 5}


def test_status_counts_pending_and_dead_per_topic(migrated_db, tmp_path):
    box = Outbox.make(migrated_db)
    box.commit("status.a", [1, 2, 3])
    box.commit("status.b", [{"status": 410}])
    # status.b's only message is refused for good: dead at once
    with http_receiver() as receiver:
        failed = run_relay(
            migrated_db, receiver.url, "--once", "--topic-prefix", "status.b", "--lease", "5"
        )
    assert failed.returncode == 0, failed.stderr
    box.commit("status.c", [1, 2])
    done = run_relay(
        migrated_db, f"file:{tmp_path / 'c.jsonl'}", "--once", "--topic-prefix", "status.c"
    )
    assert done.returncode == 0, done.stderr
    name = f"relay_status_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(f"create role {name} login in role keel_relay")
    try:  # as the relay's own login: counts of every tenant, from the delivery columns
        relay_dsn = conninfo.make_conninfo(migrated_db, user=name)
        result = run_agentkeel("relay", "status", "--dsn", relay_dsn, "--format", "json")
        assert result.returncode == 0, result.stderr
        table = run_agentkeel("relay", "status", "--dsn", relay_dsn)
        assert table.returncode == 0 and "status.a" in table.stdout
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(f"drop role {name}")
    topics = {t["topic"]: t for t in json.loads(result.stdout)["topics"]}
    assert (topics["status.a"]["pending"], topics["status.a"]["dead"]) == (3, 0)
    assert topics["status.a"]["oldest_pending_age_s"] >= 0
    assert topics["status.a"]["delivered_last_hour"] == 0
    assert (topics["status.b"]["pending"], topics["status.b"]["dead"]) == (0, 1)
    c = topics["status.c"]
    assert (c["pending"], c["dead"], c["delivered_last_minute"], c["delivered_last_hour"]) == (
        0,
        0,
        2,
        2,
    )
    assert c["per_second_last_minute"] > 0


def test_sigterm_finishes_the_publish_in_flight_acks_it_and_releases_the_rest(migrated_db):
    box = Outbox.make(migrated_db)
    sent = box.commit("slow.hook", [{"n": n} for n in range(5)])
    with http_receiver(delay=1.5) as receiver:
        relay = start_relay(
            migrated_db, receiver.url, "--batch", "5", "--concurrency", "1", "--timeout", "10"
        )
        deadline = time.monotonic() + 30
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.requests, "the relay never published"
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    assert relay.returncode == 0, stderr
    rows = {str(r["message_id"]): r for r in box.rows()}
    first = receiver.requests[0][1]["message_id"]
    assert len(receiver.requests) == 1
    assert rows[first]["state"] == "delivered"
    rest = [rows[m] for m in sent if m != first]
    assert all(r["state"] == "pending" and r["claimed_by"] is None for r in rest)
    assert all(r["attempts"] == 0 and not r["backing_off"] for r in rest)  # given back
    assert "stopping" in stderr


def test_listen_wakes_the_relay_long_before_its_poll_interval(migrated_db, tmp_path):
    box = Outbox.make(migrated_db)
    sink = tmp_path / "out.jsonl"
    relay = start_relay(migrated_db, f"file:{sink}", "--poll-interval", "600")
    try:
        # The relay says when its LISTEN is in place: from then on a commit wakes it.
        assert relay.stderr is not None
        for line in relay.stderr:
            if '"event": "listening"' in line:
                break
        else:
            pytest.fail("the relay ended without listening")
        sent = box.commit("wake.up", [{"n": 1}])
        box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
        assert [json.loads(line)["message_id"] for line in sink.read_text().splitlines()] == sent
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)
    assert relay.returncode == 0


def test_relay_env_drops_the_callers_failpoint(monkeypatch):
    monkeypatch.setenv("AGENTKEEL_RELAY_FAILPOINT", "after_claim")
    assert "AGENTKEEL_RELAY_FAILPOINT" not in relay_env()


def test_through_pgbouncer_in_transaction_mode_the_relay_delivers_and_polls(
    migrated_db, through_pgbouncer, tmp_path
):
    """Claim, ack, nack and release are one transaction each, so a transaction pooler that
    hands every one to another backend is fine; LISTEN is not, so the relay polls."""
    pooled = through_pgbouncer(migrated_db, round_robin=True)
    box = Outbox.make(migrated_db)
    sent = box.commit("pooled.out", [{"n": n} for n in range(9)])
    sink = tmp_path / "out.jsonl"
    once = run_relay(pooled, f"file:{sink}", "--once", "--batch", "4", "--no-prepare")
    assert once.returncode == 0, once.stderr
    assert sorted(json.loads(line)["message_id"] for line in sink.read_text().splitlines()) == (
        sorted(sent)
    )
    assert box.states() == {"delivered": 9}
    daemon = start_relay(pooled, f"file:{sink}", "--no-prepare", "--poll-interval", "0.2")
    more = box.commit("pooled.out", [{"n": 9}])
    box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
    daemon.send_signal(signal.SIGTERM)
    _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr
    assert "pooler detected" in stderr
    assert json.loads(sink.read_text().splitlines()[-1])["message_id"] == more[0]


def test_the_relay_reconnects_when_its_backends_are_terminated(migrated_db, tmp_path):
    box = Outbox.make(migrated_db)
    sink = tmp_path / "out.jsonl"
    first = box.commit("reconnect.a", [{"n": 1}])
    relay = start_relay(migrated_db, f"file:{sink}", "--poll-interval", "0.2")
    try:
        box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            killed = conn.execute(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity"
                " where application_name = 'agentkeel-relay'"
            ).fetchone()
        assert killed is not None and killed[0] == 2  # the claim/ack one and the LISTEN one
        second = box.commit("reconnect.b", [{"n": 2}])
        box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
    finally:
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    assert relay.returncode == 0, stderr
    delivered = [json.loads(line)["message_id"] for line in sink.read_text().splitlines()]
    assert delivered == [*first, *second]
    assert "database connection lost: reconnecting" in stderr


def test_a_partial_batch_is_followed_by_the_next_claim_at_once(migrated_db, tmp_path):
    """Per-key order lets a claim take one message per key: 40 messages on 4 keys come in
    batches of 4, each smaller than --batch. The relay used to wait --poll-interval after
    each (here 600 s, so it stalled after the first 4); it claims again while it finds."""
    box = Outbox.make(migrated_db)
    sent = box.commit("keyed.out", list(range(40)), keys=[f"k{n % 4}" for n in range(40)])
    sink = tmp_path / "out.jsonl"
    relay = start_relay(migrated_db, f"file:{sink}", "--poll-interval", "600", "--no-listen")
    try:
        box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=120)
    finally:
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    assert relay.returncode == 0, stderr
    delivered = [json.loads(line)["message_id"] for line in sink.read_text().splitlines()]
    assert sorted(delivered) == sorted(sent)
    for key in range(4):  # per-key order held
        assert [m for m in delivered if sent.index(m) % 4 == key] == sent[key::4]


def test_a_connection_lost_in_the_first_batch_is_reconnected(migrated_db):
    """The relay's backends are terminated while it publishes its first batch: it used to
    exit 4 (57P01) as if its setup were wrong; it reconnects and delivers everything."""
    box = Outbox.make(migrated_db)
    sent = box.commit("first.batch", [{"n": n} for n in range(3)])
    with http_receiver(delay=1.0) as receiver:
        relay = start_relay(
            migrated_db, receiver.url, "--lease", "2", "--poll-interval", "0.2",
            "--batch", "3", "--concurrency", "1", "--timeout", "10",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not receiver.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert receiver.requests, "the relay never published"
            with psycopg.connect(migrated_db, autocommit=True) as conn:
                conn.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity"
                    " where application_name = 'agentkeel-relay'"
                )
            box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=120)
        finally:
            relay.send_signal(signal.SIGTERM)
            _, stderr = relay.communicate(timeout=30)
    assert relay.returncode == 0, stderr
    assert "database connection lost: reconnecting" in stderr
    assert set(sent) <= {body["message_id"] for _, body in receiver.requests}


def test_a_flood_of_notifications_does_not_drive_back_to_back_claims(migrated_db):
    """Any login may NOTIFY keel_outbox. With nothing due, each notification used to wake
    the relay into another claim; now claims after an empty one are at least
    --wake-cooldown apart. Claims are counted by the database (track_functions)."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            sql.SQL("alter database {} set track_functions = 'pl'").format(
                sql.Identifier(conn.info.dbname)
            )
        )
    started = time.monotonic()  # the relay's whole life is the window its claims fall in
    relay = start_relay(migrated_db, "-", "--poll-interval", "600", "--wake-cooldown", "0.2")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and '"relay started"' not in (
            relay.stderr.readline() if relay.stderr else ""
        ):
            pass
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            for _ in range(3000):
                conn.execute("notify keel_outbox")
    finally:
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert relay.returncode == 0, stderr
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:  # the relay's backends report their counts as they exit
            row = conn.execute(
                "select coalesce(sum(calls), 0) from pg_stat_user_functions"
                " where schemaname = 'keel' and funcname = 'claim_outbox'"
            ).fetchone()
            claims = int(row[0]) if row else 0
            if claims or time.monotonic() > deadline:
                break
            conn.execute("select pg_stat_clear_snapshot()")
            time.sleep(0.2)
    if claims == 0:
        pytest.skip("inconclusive: the database reported no keel.claim_outbox call in 30 s")
    # the first claim, then one per cooldown at most
    assert claims <= elapsed / 0.2 + 2, (claims, elapsed)


def test_a_message_no_decoder_accepts_is_delivered_as_stored_and_stops_nothing(
    migrated_db, tmp_path
):
    """Issue 23, class 1: a payload Python's json refuses (an integer of 5000 digits; a
    magnitude no double holds, which would come out as Infinity, itself not JSON) made the
    relay exit while decoding a claimed batch, and every message of the batch, of every
    tenant, spent an attempt each time until all were dead. Stored before the payload
    check refused such numbers (planted here as a superuser), it is now forwarded byte for
    byte like any other, and the batch is delivered."""
    outbox = Outbox.make(migrated_db)
    before = outbox.commit("poison.before", [{"n": 1}])
    huge = "9" * 5000
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        for payload in (f'{{"n": {huge}}}', '{"n": 1e400}', "[-1e400, 1e-400]"):
            conn.execute(
                "insert into keel.outbox (tenant_id, topic, payload) values (%s, %s, %s::jsonb)",
                (outbox.tenant, "poison.planted", payload),
            )
    after = outbox.commit("poison.after", [{"n": 2}])
    sink = tmp_path / "out.jsonl"
    result = run_relay(migrated_db, f"file:{sink}", "--once", "--batch", "10")
    assert result.returncode == 0, result.stderr
    lines = sink.read_text().splitlines()
    delivered = [json.loads(line, parse_int=str, parse_float=str) for line in lines]
    assert {m["message_id"] for m in delivered} >= {*before, *after}
    planted = [m["payload"] for m in delivered if m["topic"] == "poison.planted"]
    assert len(planted) == 3 and {"n": huge} in planted
    with psycopg.connect(migrated_db) as conn:  # not the payloads: Python cannot read one
        states = conn.execute(
            "select distinct state from keel.outbox where tenant_id = %s", (outbox.tenant,)
        ).fetchall()
    assert states == [("delivered",)]


def test_relay_dead_lists_and_replays_dead_messages_of_every_tenant(migrated_db):
    """As a keel_relay login: `relay dead list` shows the dead messages of two tenants
    (no payload), filtered by tenant, topic or id; `replay` needs a filter or --all,
    --dry-run changes nothing, and a replay puts them back under the same ids."""
    first, second = Outbox.make(migrated_db), Outbox.make(migrated_db)
    a = first.commit("dead.list", [{"status": 410}, {"status": 410}])
    b = second.commit("dead.other", [{"status": 404}])
    with http_receiver() as receiver:
        delivered = run_relay(migrated_db, receiver.url, "--once")
    assert delivered.returncode == 0, delivered.stderr
    name = f"relay_ops_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(f"create role {name} login in role keel_relay")
    try:
        dsn = conninfo.make_conninfo(migrated_db, user=name)

        def dead(*args: str) -> dict:
            result = run_agentkeel("relay", "dead", *args, "--dsn", dsn, "--format", "json")
            assert result.returncode == 0, result.stderr
            return json.loads(result.stdout)

        listed = dead("list")["dead"]
        assert sorted(m["message_id"] for m in listed) == sorted(a + b)
        assert all("payload" not in m and m["last_error"].startswith("HTTP 4") for m in listed)
        assert [m["message_id"] for m in dead("list", "--tenant", str(second.tenant))["dead"]] == b
        assert len(dead("list", "--topic", "dead.list")["dead"]) == 2
        assert [m["message_id"] for m in dead("list", "--id", a[1])["dead"]] == [a[1]]
        assert len(dead("list", "--limit", "1")["dead"]) == 1

        unnamed = run_agentkeel("relay", "dead", "replay", "--dsn", dsn)
        assert unnamed.returncode == 2 and "--all" in unnamed.stderr
        bad = run_agentkeel("relay", "dead", "list", "--dsn", dsn, "--tenant", "x")
        assert bad.returncode == 2 and "not a uuid" in bad.stderr

        dry = dead("replay", "--topic", "dead.list", "--dry-run")
        assert (dry["dry_run"], sorted(dry["replayed"])) == (True, sorted(a))
        assert first.states() == {"dead": 2}
        done = dead("replay", "--topic", "dead.list")
        assert sorted(done["replayed"]) == sorted(a) and done["no_longer_dead"] == 0
        rows = first.rows()
        assert [(r["state"], r["attempts"], r["claims"]) for r in rows] == [("pending", 0, 0)] * 2
        assert second.states() == {"dead": 1}
        assert dead("replay", "--all")["replayed"] == b
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(f"drop role {name}")
