"""The nats:// sink against real NATS JetStream: the shared server on 127.0.0.1:4222 (a
stream of the test's own, deleted after) and servers the tests start and stop themselves.
Delivery with Nats-Msg-Id; the kill matrix (the stream still holds exactly one copy);
the broker down, then back: nothing lost, the backoff visible in the database."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from relay_services import (
    NatsServer,
    Outbox,
    any_nats,
    free_port,
    nats_binary,
    run_relay,
    start_relay,
    stream,
    stream_messages,
)


@pytest.fixture
def nats_url(tmp_path):
    """The machine's NATS when it answers (CI starts it), else one of our own."""
    with any_nats(tmp_path / "nats") as url:
        yield url


def test_every_message_is_published_once_with_its_id(migrated_db, nats_url):
    box = Outbox.make(migrated_db)
    with stream(nats_url) as (name, prefix):
        sent = box.commit("orders.created", [{"n": n} for n in range(20)])
        result = run_relay(migrated_db, f"{nats_url}/{prefix}", "--once", "--batch", "7")
        assert result.returncode == 0, result.stderr
        held = stream_messages(nats_url, name)
    assert [msg_id for msg_id, _ in held] == [b["message_id"] for _, b in held]
    assert sorted(msg_id for msg_id, _ in held) == sorted(sent)
    assert {b["topic"] for _, b in held} == {"orders.created"}
    assert box.states() == {"delivered": 20}


@pytest.mark.parametrize("failpoint", ["after_claim", "after_publish", "after_ack"])
def test_a_relay_killed_at_each_failpoint_leaves_exactly_one_copy_in_the_stream(
    migrated_db, nats_url, failpoint
):
    """The second batch is published twice after a publish-before-ack crash; JetStream
    drops the second copy by Nats-Msg-Id."""
    box = Outbox.make(migrated_db)
    with stream(nats_url) as (name, prefix):
        sent = box.commit("kill.matrix", [{"n": n} for n in range(12)])
        sink = f"{nats_url}/{prefix}"
        args = ("--once", "--batch", "4", "--lease", "1")
        crashed = run_relay(migrated_db, sink, *args, failpoint=f"{failpoint}:2")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        time.sleep(1.3)
        restarted = run_relay(migrated_db, sink, *args)
        assert restarted.returncode == 0, restarted.stderr
        held = stream_messages(nats_url, name)
    assert Counter(msg_id for msg_id, _ in held) == Counter(sent)
    assert box.states() == {"delivered": 12}


def test_the_broker_down_then_back_loses_nothing_and_spends_no_attempt(migrated_db, tmp_path):
    """With the broker down the relay claims, finds it unreachable, gives the claims back
    and pauses: no attempt is spent, nothing goes dead; once it is back, everything is
    delivered. Fails on the code before this change (every message spent attempts, one per
    claim, and went dead after the maximum)."""
    nats_binary()
    server = NatsServer(tmp_path / "nats").start()
    box = Outbox.make(migrated_db)
    relay = None
    try:
        with stream(server.url) as (name, prefix):
            server.stop()  # the stream is kept in the store directory
            sent = box.commit("broker.down", [{"n": n} for n in range(10)])
            relay = start_relay(
                migrated_db,
                f"{server.url}/{prefix}",
                "--poll-interval",
                "0.2",
                "--timeout",
                "0.5",
                "--lease",
                "5",
            )
            # every message was claimed, and given back
            box.wait_for(
                lambda rows: all(r["claimed_at"] and r["claimed_by"] is None for r in rows),
                timeout=30,
            )
            rows = box.rows()
            assert all(r["state"] == "pending" and r["attempts"] == 0 for r in rows)
            assert all(r["last_error"] is None and not r["backing_off"] for r in rows)
            server.start()
            box.wait_for(lambda rows: all(r["state"] == "delivered" for r in rows), timeout=60)
            held = stream_messages(server.url, name)
            assert Counter(msg_id for msg_id, _ in held) == Counter(sent)
            assert all(r["attempts"] == 0 for r in box.rows())
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
        assert relay.returncode == 0, stderr
        events = [json.loads(line)["event"] for line in stderr.splitlines()]
        assert "sink unreachable: claims given back without spending an attempt; pausing" in (
            events
        )
        assert "sink reachable again" in events and "dead letter" not in events
    finally:
        if relay is not None and relay.poll() is None:
            relay.kill()
            relay.communicate(timeout=30)
        server.stop()


def test_once_against_a_broker_that_refuses_connections_says_so_and_exits_6(migrated_db):
    """Before: `nats: TimeoutError`, exit 0, an attempt spent per message."""
    box = Outbox.make(migrated_db)
    box.commit("broker.refused", [{"n": 1}])
    port = free_port()  # nothing listens on it
    result = run_relay(migrated_db, f"nats://127.0.0.1:{port}/keel", "--once", "--timeout", "1")
    assert result.returncode == 6, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("agentkeel: error: the sink cannot be reached"), last
    assert f"cannot connect to nats://127.0.0.1:{port} (connection refused)" in last
    [row] = box.rows()
    assert (row["state"], row["attempts"], row["claims"]) == ("pending", 0, 0)
