"""The http(s):// sink against a real HTTP server on loopback: 2xx acks; any other 4xx is
final (dead at once); 500, 408 and timeouts are retried with backoff (an attempt each);
502, 503, 504, 429 and a refused connection say the endpoint is unavailable: the claims
are given back without spending an attempt; every request carries Idempotency-Key = the
message id."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

from agentkeel.exitcodes import AgentkeelError, ExitCode
from agentkeel.relay import Config, parse_sink, run
from agentkeel.relay.sinks import http_outcome
from relay_services import Outbox, http_receiver

FINAL = (400, 404, 410, 422)
RETRIED = (500, 408)
UNAVAILABLE = (502, 503, 504, 429)
ACKED = (200, 201, 202, 204)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (200, "ack"),
        (299, "ack"),
        (400, "dead"),
        (499, "dead"),
        (408, "retry"),
        (429, "outage"),
        (500, "retry"),
        (502, "outage"),
        (503, "outage"),
        (504, "outage"),
        (302, "retry"),
        (100, "retry"),
    ],
)
def test_what_each_status_means(status, kind):
    assert http_outcome(status).kind == kind


def slow_backoff(dsn: str) -> None:
    """A retried message stays away for minutes (full jitter: random() * base), so that
    `--once` does not try it again in the same run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "update keel.settings set value = '1 hour' where setting = 'outbox_backoff_base'"
        )


def test_statuses_decide_ack_dead_or_retry(migrated_db):
    slow_backoff(migrated_db)
    box = Outbox.make(migrated_db)
    asked = [*ACKED, *FINAL, *RETRIED, "hang"]
    sent = box.commit("hook.status", [{"status": s} for s in asked])
    with http_receiver() as receiver:
        stats = asyncio.run(
            run(
                Config(
                    dsn=migrated_db,
                    once=True,
                    handle_signals=False,
                    lease=timedelta(seconds=30),
                    concurrency=8,
                ),
                parse_sink(receiver.url, timeout=2.0),
            )
        )
    assert (stats.acked, stats.dead, stats.retried) == (4, 4, 3)
    rows = {str(r["message_id"]): r for r in box.rows()}
    for message_id, status in zip(sent, asked, strict=True):
        row = rows[message_id]
        if status in ACKED:  # a claim is not an attempt: only failures count
            assert row["state"] == "delivered" and row["last_error"] is None
            assert row["attempts"] == 0
        elif status in FINAL:
            assert row["state"] == "dead" and row["last_error"] == f"HTTP {status}"
            assert row["attempts"] == 1
        else:  # retried later: pending, backing off, the failure recorded
            assert row["state"] == "pending" and row["claimed_by"] is None
            assert row["available_at"] >= row["claimed_at"]
            expected = "ReadTimeout" if status == "hang" else f"HTTP {status}"
            assert expected in row["last_error"] and row["attempts"] == 1
    # Each request named its message, as the Idempotency-Key and in the body.
    assert len(receiver.requests) == len(asked)
    for headers, body in receiver.requests:
        assert headers["Idempotency-Key"] == body["message_id"]
        assert headers["Content-Type"] == "application/json"
    assert {body["message_id"] for _, body in receiver.requests} == set(sent)


def once_against(dsn: str, url: str) -> AgentkeelError:
    """`--once` against an endpoint that is down: the error it exits with."""
    with pytest.raises(AgentkeelError) as info:
        config = Config(dsn=dsn, once=True, handle_signals=False, concurrency=1)
        asyncio.run(run(config, parse_sink(url, 1.0)))
    return info.value


@pytest.mark.parametrize("status", UNAVAILABLE)
def test_an_unavailable_endpoint_spends_no_attempt_and_once_exits_non_zero(migrated_db, status):
    """Fails on the code before this change: 502, 503 and 429 were retried, an attempt each,
    and --once exited 0 having delivered nothing."""
    box = Outbox.make(migrated_db)
    box.commit("hook.busy", [{"status": status}, {"status": 200}])
    with http_receiver() as receiver:
        error = once_against(migrated_db, receiver.url)
        assert len(receiver.requests) == 1  # the rest of the batch was not tried
    assert error.code == ExitCode.CONNECTION
    assert f"HTTP {status}" in str(error) and "0 delivered" in str(error)
    for row in box.rows():
        assert (row["state"], row["attempts"], row["claims"]) == ("pending", 0, 0)
        assert row["claimed_by"] is None and row["last_error"] is None


def test_a_refused_connection_spends_no_attempt(migrated_db):
    box = Outbox.make(migrated_db)
    box.commit("hook.down", [{"n": 1}])
    with http_receiver() as receiver:
        url = receiver.url
    # the receiver is gone: nothing listens on its port any more
    error = once_against(migrated_db, url)
    assert error.code == ExitCode.CONNECTION and "cannot connect" in str(error)
    [row] = box.rows()
    assert (row["state"], row["attempts"], row["claims"]) == ("pending", 0, 0)
    assert not row["backing_off"]


def test_an_unavailable_answer_for_one_message_while_others_get_through_is_an_attempt(
    migrated_db,
):
    """A 503 (or 429) for one message while the endpoint confirms others in the same cycle
    is about that message: an attempt, with backoff, and no pause for everyone; only a
    message never sent is given back. Before, it was an outage: the message was handed
    out forever, attempts 0, and every tenant's delivery paused."""
    slow_backoff(migrated_db)
    box = Outbox.make(migrated_db)
    [ok] = box.commit("hook.picky", [{"status": 200}])  # claimed first: due earlier
    [refused] = box.commit("hook.picky", [{"status": 503}])
    with http_receiver() as receiver:
        config = Config(dsn=migrated_db, once=True, handle_signals=False, concurrency=1)
        stats = asyncio.run(run(config, parse_sink(receiver.url, 1.0)))
    assert (stats.acked, stats.retried, stats.unreachable) == (1, 1, 0)
    rows = {str(r["message_id"]): r for r in box.rows()}
    assert rows[ok]["state"] == "delivered"
    assert (rows[refused]["state"], rows[refused]["attempts"]) == ("pending", 1)
    assert rows[refused]["last_error"] == "HTTP 503" and rows[refused]["backing_off"]
