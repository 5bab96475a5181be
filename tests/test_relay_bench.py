"""`agentkeel bench --workload relay` measures the relay to a file and to NATS at batch 1 and 100,
and leaves nothing behind."""

from __future__ import annotations

import psycopg

from agentkeel.bench import run_relay_bench
from conftest import run_agentkeel
from relay_services import SHARED_NATS, nats_answers


def test_every_relay_case_is_measured_and_cleaned_up(migrated_db):
    results = run_relay_bench(migrated_db, messages=30)
    assert [(r.sink.split()[0], r.batch) for r in results] == [
        ("file", 1),
        ("file", 100),
        ("NATS", 1),
        ("NATS", 100),
    ]
    for r in results:
        if r.seconds is None:  # only NATS may be skipped, and only when none answers
            assert r.sink.startswith("NATS") and not nats_answers(SHARED_NATS)
            assert r.note.startswith("skipped: no JetStream")
        else:
            assert r.per_second and r.per_second > 0
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select count(*) from keel.tenants").fetchone() == (0,)
        assert conn.execute("select count(*) from keel.outbox").fetchone() == (0,)


def test_the_command_prints_the_relay_table(migrated_db):
    result = run_agentkeel(
        "bench", "--workload", "relay", "--dsn", migrated_db, "--relay-messages", "20"
    )
    assert result.returncode == 0, result.stderr
    assert "messages/s" in result.stdout and "NATS JetStream" in result.stdout
