"""`agentkeel bench` measures every workload against its plain-SQL floor, and the policy
cost, and leaves nothing behind."""

from __future__ import annotations

import json

import psycopg

from agentkeel.bench import run as run_policy
from agentkeel.workloads import WORKLOAD_NAMES, run, summarize
from conftest import run_agentkeel


def leftovers(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(dsn) as conn:
        return (
            conn.execute("select count(*) from keel.tenants").fetchone(),
            conn.execute("select count(*) from keel.workflows").fetchone(),
            conn.execute("select count(*) from pg_roles where rolname like 'bench%'").fetchone(),
            conn.execute(
                "select count(*) from pg_namespace where nspname like 'agentkeel_bench%'"
            ).fetchone(),
        )


def test_every_policy_case_is_measured_and_cleaned_up(migrated_db):
    results = run_policy(migrated_db, rows=200, repeats=1)
    assert [m.case.split(",")[0] for m in results] == ["no RLS (owner", "app", "app", "agent"]
    assert all(m.best_ms > 0 for m in results)
    assert [m.rows_scanned for m in results] == [400, 400, 400, 200]
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))


def test_every_workload_runs_on_both_sides_and_leaves_nothing(migrated_db):
    runs = run(migrated_db, list(WORKLOAD_NAMES), [2], duration=1.0, repeats=1, finished_rows=50)
    assert {(r.workload, r.side) for r in runs} == {
        (w, side) for w in WORKLOAD_NAMES for side in ("floor", "keel")
    }
    # Each side did its work: ops counted, latencies and per-second slices recorded.
    assert all(r.ops > 0 and len(r.latencies_ms) > 0 and sum(r.slices) == r.ops for r in runs)
    summary = summarize(runs)
    assert [s.workload for s in summary] == list(WORKLOAD_NAMES)
    assert all(s.ratio > 0 for s in summary)
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))


def test_the_keel_side_wrote_through_the_guarded_functions(migrated_db):
    """The keel side's transitions leave their events and outbox rows (then removed): a
    run that wrote nothing would report any throughput it liked."""
    seen: list[tuple[int, int]] = []

    def watch(label: str, index: int, elapsed: float) -> None:
        if label.startswith("transition") and " keel " in label and elapsed > 0.5 and not seen:
            with psycopg.connect(migrated_db) as conn:
                row = conn.execute(
                    "select (select count(*) from keel.task_events),"
                    " (select count(*) from keel.outbox)"
                ).fetchone()
            assert row is not None
            seen.append((int(row[0]), int(row[1])))

    run(migrated_db, ["transition"], [1], duration=1.0, repeats=1, progress=watch)
    assert seen and seen[0][0] > 0 and seen[0][1] > 0, seen


def test_the_command_prints_the_table_and_json(migrated_db):
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--workers", "1",
        "--duration", "1", "--repeats", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "reserve" in result.stdout and "ratio" in result.stdout
    as_json = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--workload", "policy",
        "--rows", "100", "--workers", "1", "--duration", "1", "--repeats", "1", "--json",
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)  # one document, nothing else on stdout
    assert len(document["policy"]) == 4 and document["policy"][0]["best_ms"] > 0
    assert {(r["workload"], r["side"]) for r in document["runs"]} == {
        ("reserve", "floor"),
        ("reserve", "keel"),
    }
    assert document["summary"][0]["ratio"] > 0


def test_a_bad_worker_list_is_a_usage_error(migrated_db):
    result = run_agentkeel("bench", "--dsn", migrated_db, "--workers", "0,x")
    assert result.returncode == 2
    assert "--workers" in result.stderr
