"""G6 end to end: the real `agentkeel relay` (a subprocess, logged in as a keel_relay login,
delivering to a file) is SIGKILLed at each failpoint and restarted. Every committed message
is delivered at least once; a duplicate appears only after a crash between publish and ack,
and carries the same message id; nothing from a rolled-back transaction is delivered; an
inbox consumer applies each effect once. No broker is needed: the file sink fsyncs before
it acks. The relay only claims topics under this test's own prefix, so the messages of the
database under test are never touched."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentkeel.client import Keel
from agentkeel_conformance.connections import NO_PREPARE_ENV
from agentkeel_conformance.harness import dsn_env, in_tenant

pytestmark = pytest.mark.guarantee("G6")

FAILPOINT_ENV = "AGENTKEEL_RELAY_FAILPOINT"
LEASE = 1.0  # seconds: a killed relay's claims are due again this soon


def relay(dsn: str, sink: Path | str, prefix: str, *args: str, failpoint: str | None = None):
    """Run `agentkeel relay --once` to completion (or to its SIGKILL); a Path is a file
    sink, a string a sink URL."""
    env = dsn_env(dsn, drop=(FAILPOINT_ENV,))
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    command = [sys.executable, "-m", "agentkeel.cli", "relay"]
    url = f"file:{sink}" if isinstance(sink, Path) else sink
    command += ["--sink", url, "--topic-prefix", prefix, "--once"]
    command += ["--lease", str(LEASE), "--log-level", "warning", *args]
    if os.environ.get(NO_PREPARE_ENV):
        command.append("--no-prepare")
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def delivered(sink: Path) -> list[dict[str, Any]]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines()]


def ids(records: list[dict[str, Any]]) -> list[str]:
    return [r["message_id"] for r in records]


@contextlib.contextmanager
def failing_endpoint(status: int) -> Iterator[str]:
    """An HTTP endpoint on loopback that answers every POST with ``status``; its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def prefix() -> str:
    return f"akc-{uuid.uuid4().hex[:10]}"


def commit_messages(keel: Keel, tenant, workflow, topic: str, count: int) -> list[str]:
    """One transition carrying ``count`` messages, committed; their ids in position order."""
    task = keel.create_task(tenant, workflow.name, workflow.version)
    messages = [{"topic": topic, "payload": {"n": n}} for n in range(count)]
    keel.transition_task(tenant, task.task_id, 1, "running", outbox=messages)
    with in_tenant(keel.conn, tenant):
        rows = keel.conn.execute(
            "select message_id from keel.outbox where tenant_id = %s and task_id = %s"
            " order by position",
            (tenant, task.task_id),
        ).fetchall()
    return [str(r[0]) for r in rows]


def states(keel: Keel, tenant) -> Counter[str]:
    with in_tenant(keel.conn, tenant):
        rows = keel.conn.execute(
            "select state from keel.outbox where tenant_id = %s", (tenant,)
        ).fetchall()
    return Counter(r[0] for r in rows)


@pytest.fixture
def relay_dsn(login_role) -> str:
    return str(login_role("keel_relay").dsn)


def test_the_relay_delivers_every_committed_message_once_and_nothing_rolled_back(
    keel, tenant, workflow, relay_dsn, tmp_path
):
    """Messages of a committed transition are delivered, each once, with its id, tenant,
    topic, key, headers, payload and creation time; a transition rolled back after writing
    its messages delivers nothing; every delivered message is acked in the database.
    Mutation: outbox_dropped."""
    topic = f"{prefix()}.order"
    committed = commit_messages(keel, tenant, workflow, topic, 7)
    task = keel.create_task(tenant, workflow.name, workflow.version)
    keyed = {"topic": topic, "key": "A-17", "headers": {"type": "refund"}, "payload": {"x": 1}}
    keel.transition_task(tenant, task.task_id, 1, "running", outbox=[keyed])
    rolled_back_task = keel.create_task(tenant, workflow.name, workflow.version)
    conn = keel.conn
    with conn.transaction(force_rollback=True), Keel(conn).transaction(tenant):
        Keel(conn).transition_task(
            tenant, rolled_back_task.task_id, 1, "running", outbox=[{"topic": topic}] * 3
        )
        rolled_back = {
            str(r[0])
            for r in conn.execute(
                "select message_id from keel.outbox where tenant_id = %s and task_id = %s",
                (tenant, rolled_back_task.task_id),
            )
        }
    assert len(rolled_back) == 3  # they existed, inside the transaction that rolled back

    sink = tmp_path / "out.jsonl"
    run = relay(relay_dsn, sink, topic.split(".")[0], "--batch", "3")
    assert run.returncode == 0, run.stderr
    records = delivered(sink)
    assert Counter(ids(records)) == Counter([*committed, *ids([r for r in records if r["key"]])])
    assert len(records) == 8 and len(set(ids(records))) == 8
    assert not rolled_back & set(ids(records))
    one = next(r for r in records if r["key"] == "A-17")
    assert (one["tenant_id"], one["topic"], one["headers"], one["payload"]) == (
        str(tenant),
        topic,
        {"type": "refund"},
        {"x": 1},
    )
    assert one["created_at"]
    assert states(keel, tenant) == Counter({"delivered": 8})


@pytest.mark.parametrize("failpoint", ["after_claim", "after_publish", "after_ack"])
def test_a_relay_killed_at_each_failpoint_loses_nothing_and_duplicates_only_what_it_published(
    keel, tenant, workflow, relay_dsn, tmp_path, failpoint
):
    """The relay is SIGKILLed in its second batch: after the claim committed, after the
    publish before the ack, after the ack statement before its commit. Restarted once the
    lease ran out, it delivers every message; the only duplicates are the second batch's,
    only when that batch was published, with the same message id and content; an inbox
    consumer that reads every line applies each message's effect exactly once.
    Mutation: outbox_dropped."""
    topic_prefix = prefix()
    committed = commit_messages(keel, tenant, workflow, f"{topic_prefix}.k", 12)
    sink = tmp_path / "out.jsonl"

    crashed = relay(relay_dsn, sink, topic_prefix, "--batch", "4", failpoint=f"{failpoint}:2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = ids(delivered(sink))
    published_before_crash = 4 if failpoint == "after_claim" else 8
    assert len(before) == published_before_crash
    time.sleep(LEASE + 0.3)  # the dead relay's claims expire
    restarted = relay(relay_dsn, sink, topic_prefix, "--batch", "4")
    assert restarted.returncode == 0, restarted.stderr

    records = delivered(sink)
    counts = Counter(ids(records))
    assert set(counts) == set(committed), "a committed message was lost"
    twice = {m for m, n in counts.items() if n > 1}
    assert max(counts.values()) <= 2
    if failpoint == "after_claim":
        assert not twice, "duplicates without a publish before the crash"
    else:
        assert twice == set(before[4:8]), "duplicates other than the batch in flight"
    for message_id in twice:  # a redelivery is the same message
        copies = [r for r in records if r["message_id"] == message_id]
        assert copies[0] == copies[1]
    assert states(keel, tenant) == Counter({"delivered": 12})

    consumer = f"akc-consumer-{failpoint}"
    applied = 0
    for record in records:  # duplicates included, in delivery order
        conn = keel.conn
        with Keel(conn).transaction(tenant):
            row = conn.execute(
                "select keel.inbox_accept(%s, %s, %s)", (tenant, consumer, record["message_id"])
            ).fetchone()
            if row[0]:  # the effect, in the same transaction as the accept
                Keel(conn).create_task(
                    tenant,
                    workflow.name,
                    workflow.version,
                    metadata={"applied": record["message_id"]},
                )
                applied += 1
    with in_tenant(keel.conn, tenant):
        effects = keel.conn.execute(
            "select metadata->>'applied' from keel.tasks where tenant_id = %s"
            " and metadata ? 'applied'",
            (tenant,),
        ).fetchall()
    assert applied == 12
    assert Counter(r[0] for r in effects) == Counter(committed)


def test_four_relays_at_once_deliver_no_message_twice(keel, tenant, workflow, relay_dsn, tmp_path):
    """Four relays drain the same messages concurrently, in small batches: every message is
    delivered by exactly one of them (claims skip each other's locked rows and never share a
    message while the lease holds).
    No mutation: a claim without SKIP LOCKED waits instead of sharing; no planted bug here."""
    topic_prefix = prefix()
    committed = commit_messages(keel, tenant, workflow, f"{topic_prefix}.k", 60)
    sinks = [tmp_path / f"relay-{n}.jsonl" for n in range(4)]
    env = dsn_env(relay_dsn, drop=(FAILPOINT_ENV,))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentkeel.cli",
                "relay",
                "--sink",
                f"file:{sink}",
                "--topic-prefix",
                topic_prefix,
                "--once",
                "--batch",
                "3",
                "--log-level",
                "warning",
                *(["--no-prepare"] if os.environ.get(NO_PREPARE_ENV) else []),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for sink in sinks
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    counts = Counter(m for sink in sinks for m in ids(delivered(sink)))
    assert counts == Counter(committed)
    assert states(keel, tenant) == Counter({"delivered": 60})


def test_a_message_committed_after_a_later_id_is_still_delivered(
    keel, tenant, workflow, relay_dsn, tmp_path, connect
):
    """Commit-order inversion: a transaction writes a message, another writes a later one
    and commits first, the relay runs and delivers the later one; when the first commits,
    its (smaller) id is delivered too: no high-water mark skips it.
    No mutation: the relay has no high-water mark to plant; the claim is shared SQL."""
    topic_prefix = prefix()
    topic = f"{topic_prefix}.k"
    early_task = keel.create_task(tenant, workflow.name, workflow.version)
    sink = tmp_path / "out.jsonl"
    slow = connect()
    with Keel(slow).transaction(tenant):
        Keel(slow).transition_task(
            tenant, early_task.task_id, 1, "running", outbox=[{"topic": topic}]
        )
        early = str(
            slow.execute(
                "select message_id from keel.outbox where tenant_id = %s and task_id = %s",
                (tenant, early_task.task_id),
            ).fetchone()[0]
        )
        late = commit_messages(keel, tenant, workflow, topic, 1)
        assert relay(relay_dsn, sink, topic_prefix).returncode == 0
        assert ids(delivered(sink)) == late
    assert relay(relay_dsn, sink, topic_prefix).returncode == 0
    assert ids(delivered(sink)) == [*late, early]


def test_a_message_the_sink_keeps_failing_goes_dead_and_replays_under_the_same_id(
    keel, tenant, workflow, relay_dsn, tmp_path, connect
):
    """A topic allowed one attempt; the relay's HTTP endpoint (on loopback) answers 500:
    the message is dead with the error recorded, and listed; replayed, the next relay
    delivers it under the same message id.
    No mutation: the dead-letter bookkeeping is SQL, planted against in its own tests."""
    topic_prefix = prefix()
    topic = f"{topic_prefix}.once"
    owner = connect(owner=True)
    owner.execute(
        "insert into keel.outbox_topics (topic, max_attempts, description)"
        " values (%s, 1, 'agentkeel conformance')",
        (topic,),
    )
    try:
        [message] = commit_messages(keel, tenant, workflow, topic, 1)
        with failing_endpoint(500) as url:
            failed = relay(relay_dsn, url, topic_prefix)
        assert failed.returncode == 0, failed.stderr
        assert "dead letter" in failed.stderr
        with Keel(keel.conn).transaction(tenant) as conn:
            dead = conn.execute(
                "select message_id, attempts, last_error from keel.dead_outbox(%s, %s)",
                (tenant, topic),
            ).fetchall()
        assert [(str(d[0]), d[1]) for d in dead] == [(message, 1)]
        assert dead[0][2] == "HTTP 500"

        with Keel(keel.conn).transaction(tenant) as conn:
            conn.execute("select keel.replay_outbox(%s, %s)", (tenant, message))
        sink = tmp_path / "out.jsonl"
        assert relay(relay_dsn, sink, topic_prefix).returncode == 0
        assert ids(delivered(sink)) == [message]
        assert states(keel, tenant) == Counter({"delivered": 1})
    finally:
        owner.execute("delete from keel.outbox_topics where topic = %s", (topic,))
