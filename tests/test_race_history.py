"""The racing harness and its history checker catch real bugs."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel_conformance.fixtures import EDGES
from agentkeel_conformance.history import check
from agentkeel_conformance.race import RaceConfig, run_race
from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def race_setup(migrated_db):
    tenant = uuid.uuid4()
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow("akc-race", 1, "queued", EDGES)
        keel.create_tenant("race", tenant)
    return migrated_db, tenant


def test_a_correct_database_races_clean(race_setup, tmp_path):
    dsn, tenant = race_setup
    verdict, events = run_race(RaceConfig(dsn, "akc-race", tenant, seconds=3), tmp_path)
    assert verdict.ok, verdict.violations
    assert verdict.counts["committed"] > 20
    assert any(e["op"] == "effect" for e in events)
    assert verdict.counts["refused"] > 0, "no lease was ever lost: the race did not race"


def test_a_completion_without_the_token_check_is_caught(race_setup, tmp_path):
    dsn, tenant = race_setup
    source = (REPO / "functions" / "finish_operation.sql").read_text()
    broken, count = re.subn(
        r"perform keel.assert_lease\(keel.lock_task\(p_tenant_id, v_task_id, 'share'\),"
        r" p_fencing_token, v_now\);",
        "",
        source,
    )
    assert count == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(broken.encode())
    verdict, _ = run_race(RaceConfig(dsn, "akc-race", tenant, seconds=4, chaos=False), tmp_path)
    assert any("complete by" in v and "was accepted" in v for v in verdict.violations), verdict


T = "2026-01-01T00:00:{:02d}+00:00"


def claim(worker, task, token, start, end):
    return {
        "type": "ok",
        "op": "claim",
        "worker": worker,
        "task": task,
        "token": token,
        "acquired": T.format(start),
        "expires": T.format(end),
    }


def test_the_checker_names_each_violation():
    events = [
        {"type": "effect", "op": "effect", "worker": "a", "key": "k1"},
        {"type": "effect", "op": "effect", "worker": "b", "key": "k1"},
        claim("a", "t1", 1, 0, 10),
        claim("b", "t1", 2, 5, 15),  # overlaps token 1
        {
            "type": "ok",
            "op": "complete",
            "worker": "a",
            "task": "t1",
            "token": 1,
            "at": T.format(20),
        },
        {
            "type": "ok",
            "op": "transition",
            "worker": "a",
            "task": "t1",
            "token": 2,
            "version": 2,
            "at": T.format(6),
            "message": "m1",
        },
        {
            "type": "ok",
            "op": "transition",
            "worker": "b",
            "task": "t1",
            "token": 2,
            "version": 2,
            "at": T.format(7),
            "message": "m2",
        },
    ]
    final = {"events": {"t1": [(1, 1), (3, 3)]}, "outbox": {"m1": 1}, "operations": {}}
    found = "\n".join(check(events, final).violations)
    assert "effect performed 2 times for idempotency key k1" in found
    assert "two valid leases at once" in found
    assert "complete by a was accepted" in found
    assert "two transitions produced the same version" in found
    assert "has gaps or repeats" in found
    assert "outbox message m2 committed but observed 0 times" in found
    assert "committed transition to version 2 is missing" in found


def test_ambiguous_outcomes_count_only_when_they_committed():
    events = [
        {
            "type": "info",
            "op": "transition",
            "worker": "a",
            "task": "t",
            "message": "m",
            "xact": "aborted",
        },
    ]
    assert check(events, {"events": {}, "outbox": {"m": 1}, "operations": {}}).violations == [
        "outbox message m exists but its transaction did not commit"
    ]
    events[0]["xact"] = "committed"
    assert check(events, {"events": {}, "outbox": {"m": 1}, "operations": {}}).ok
