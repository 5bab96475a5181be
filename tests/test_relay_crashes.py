"""What crashes, a message that crashes the relay, and a frozen database cost, with the real
relay process: a crash between publish and ack spends no attempt; a message whose claims
keep ending with no report is published alone and dies alone, logged; the periodic status
line; a database that stops answering is reported and reconnected."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from relay_services import Outbox, http_receiver, relay_command, relay_env, run_relay

LEASE = "1"  # seconds: a killed relay's claims expire quickly


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def until_exit_0(dsn: str, sink: str, *args: str, failpoint: str, runs: int) -> list[str]:
    """Run `relay --once` with the failpoint until it exits 0 (at most `runs` times, each
    after the last one's claims expired); the stderr of every run."""
    seen: list[str] = []
    for _ in range(runs):
        result = run_relay(dsn, sink, "--once", "--lease", LEASE, *args, failpoint=failpoint)
        seen.append(result.stderr)
        if result.returncode == 0:
            return seen
        assert result.returncode == -9, result.stderr  # SIGKILL from the failpoint
        time.sleep(float(LEASE) * 1.3)
    raise AssertionError(f"the relay still crashed after {runs} runs: {seen[-1][-2000:]}")


def test_crashes_between_publish_and_ack_spend_no_attempt(migrated_db, tmp_path):
    """A topic allowed one attempt; the relay is killed after publishing, three times.
    Every message is then delivered, not dead, with attempts 0. Fails on the code before
    this change: each claim spent an attempt, so the first crash made them all dead."""
    box = Outbox.make(migrated_db)
    sent = box.commit("crash.once", [{"n": n} for n in range(6)])
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "insert into keel.outbox_topics (topic, max_attempts) values ('crash.once', 1)"
        )
    out = tmp_path / "out.jsonl"
    for _ in range(3):
        crashed = run_relay(
            migrated_db, f"file:{out}", "--once", "--lease", LEASE, failpoint="after_publish"
        )
        assert crashed.returncode == -9, crashed.stderr
        time.sleep(float(LEASE) * 1.3)
    done = run_relay(migrated_db, f"file:{out}", "--once", "--lease", LEASE)
    assert done.returncode == 0, done.stderr
    assert box.states() == {"delivered": 6}
    assert all(r["attempts"] == 0 and r["claims"] > 0 for r in box.rows())
    delivered = Counter(json.loads(line)["message_id"] for line in lines(out))
    assert set(delivered) == set(sent)  # some more than once: at least once
    assert "dead letter" not in done.stderr


def test_a_message_that_crashes_the_relay_dies_alone_and_is_logged(migrated_db, tmp_path):
    """Four messages and a poison one (the relay is killed whenever it is about to publish
    it) in one batch. After the first crash each is published alone: the four are
    delivered; the poison one's claims alone keep ending with no report, and after
    outbox_max_unreported_claims of them the claim marks it dead (attempts 0), which the
    relay logs. Fails on the code before this change: the batch was claimed together
    again and again and every message of it went dead."""
    box = Outbox.make(migrated_db)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "update keel.settings set value = '3' where setting = 'outbox_max_unreported_claims'"
        )
    innocent = box.commit("crash.innocent", [{"n": n} for n in range(4)])
    [poison] = box.commit("crash.poison", [{"n": "poison"}])
    out = tmp_path / "out.jsonl"
    runs = until_exit_0(migrated_db, f"file:{out}", failpoint="poison=crash.poison", runs=8)
    rows = {str(r["message_id"]): r for r in box.rows()}
    assert [rows[m]["state"] for m in innocent] == ["delivered"] * 4
    assert (rows[poison]["state"], rows[poison]["attempts"]) == ("dead", 0)
    assert "claimed 3 times" in rows[poison]["last_error"]
    assert {json.loads(line)["message_id"] for line in lines(out)} == set(innocent)
    deaths = [e for e in events(runs[-1]) if e["event"] == "dead letter"]
    assert [(d["message_id"], d["decided_by"]) for d in deaths] == [(poison, "claim")]
    assert events(runs[-1])[-1]["dead"] == 1  # the stopped line counts it
    alone = [e for run in runs for e in events(run) if e["event"].startswith("publishing alone")]
    assert alone, "no message was published alone after a crash"


def start_logged(dsn: str, sink: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        relay_command(dsn, sink, *args),
        env=relay_env(),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def wait_for_log(log: Path, done: Any, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        seen = events(log.read_text())
        if done(seen):
            return seen
        assert time.monotonic() < deadline, f"not logged in time: {seen[-5:]}"
        time.sleep(0.1)


def stop(relay: subprocess.Popen[bytes]) -> None:
    relay.terminate()
    assert relay.wait(timeout=30) == 0


def test_the_status_line_says_what_was_done_and_what_waits(migrated_db, tmp_path):
    box = Outbox.make(migrated_db)
    box.commit("status.line", [{"n": n} for n in range(20)])
    log = tmp_path / "relay.log"
    relay = start_logged(
        migrated_db, f"file:{tmp_path / 'out.jsonl'}", log, "--status-interval", "0.3"
    )
    try:
        seen = wait_for_log(
            log,
            lambda seen: sum(e["delivered"] for e in seen if e["event"] == "status") == 20,
        )
    finally:
        stop(relay)
    status = [e for e in seen if e["event"] == "status"]
    last = status[-1]
    assert (last["pending"], last["in_flight"], last["sink"]) == (0, 0, "ok")
    assert {"retried", "dead", "lag_s", "per_s", "seconds", "unreachable"} <= set(last)
    assert any(e["per_s"] > 0 for e in status)


def test_a_database_that_stops_answering_is_reported_and_reconnected(migrated_db, tmp_path):
    """A claim waits on a lock held by another session: after --db-timeout the relay
    reports it, drops the connection and reconnects; when the lock goes, everything is
    delivered. Fails on the code before this change (no --db-timeout: the relay waited
    silently as long as the lock was held)."""
    box = Outbox.make(migrated_db)
    box.commit("frozen.db", [{"n": n} for n in range(5)])
    log = tmp_path / "relay.log"
    with psycopg.connect(migrated_db) as holder:
        holder.execute("lock table keel.outbox in access exclusive mode")
        relay = start_logged(
            migrated_db,
            f"file:{tmp_path / 'out.jsonl'}",
            log,
            "--db-timeout",
            "1",
            "--no-listen",
        )
        try:
            wait_for_log(
                log,
                lambda seen: any(
                    e["event"] == "database connection lost: reconnecting"
                    and "did not answer within 1s" in e["error"]
                    for e in seen
                ),
            )
            holder.rollback()
            box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
            wait_for_log(log, lambda seen: any(e["event"] == "reconnected" for e in seen))
        finally:
            stop(relay)


def test_a_message_an_endpoint_alone_refuses_with_503_holds_up_no_one(migrated_db, tmp_path):
    """The first message of the outbox is one the endpoint always answers 503 for: the
    first claim takes that for an outage, but gives the refused message back after the
    ones it did not send, so the next claim sends those first; once the endpoint has
    confirmed one, the 503 is an attempt. Everything else is delivered, and the refused
    message spends attempts toward its end instead of pausing the relay for good."""
    box = Outbox.make(migrated_db)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "update keel.settings set value = '1 hour' where setting = 'outbox_backoff_base'"
        )
    [refused] = box.commit("picky.hook", [{"status": 503}])
    fine = box.commit("picky.hook", [{"n": n} for n in range(3)])
    log = tmp_path / "relay.log"
    with http_receiver() as receiver:
        relay = start_logged(
            migrated_db, receiver.url, log, "--concurrency", "1", "--poll-interval", "0.2"
        )
        try:
            box.wait_for(
                lambda rows: all(
                    r["state"] == "delivered"
                    if str(r["message_id"]) in fine
                    else r["attempts"] == 1
                    for r in rows
                ),
                timeout=60,
            )
        finally:
            stop(relay)
    row = {str(r["message_id"]): r for r in box.rows()}[refused]
    assert (row["state"], row["last_error"]) == ("pending", "HTTP 503")
