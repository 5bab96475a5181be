"""`agentkeel bench` measures every workload against its plain-SQL floor, and the policy
cost, and leaves nothing behind."""

from __future__ import annotations

import json
import signal
import subprocess

import psycopg
import pytest

from agentkeel.bench import PAYLOAD_SHAPES
from agentkeel.bench import run as run_policy
from agentkeel.bench_noisy import run_noisy_bench
from agentkeel.workloads import WORKLOAD_NAMES, run, summarize
from agentkeel_conformance.harness import wait_for
from conftest import AGENTKEEL, run_agentkeel


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
    # Not a terminal (a CI log): a progress line per run on stderr, not minutes of silence.
    assert result.stderr.splitlines() == [
        "bench: run 1 of 2: reserve x1 floor 1/1",
        "bench: run 2 of 2: reserve x1 keel 1/1",
    ]
    as_json = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--workload", "policy",
        "--rows", "100", "--workers", "1", "--duration", "1", "--repeats", "1", "--format", "json",
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    assert "bench: the tenant policy: 100 tasks per tenant" in as_json.stderr
    document = json.loads(as_json.stdout)  # one document, nothing else on stdout
    assert len(document["policy"]) == 4 and document["policy"][0]["best_ms"] > 0
    assert {(r["workload"], r["side"]) for r in document["runs"]} == {
        ("reserve", "floor"),
        ("reserve", "keel"),
    }
    assert document["summary"][0]["ratio"] > 0


def test_the_payload_workload_times_the_check_on_each_shape(migrated_db):
    """--workload payload: every shape is measured, is within the event payload limit (so
    the whole check runs, no early refusal), and leaves nothing behind."""
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "payload", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["payload"]
    assert [f["shape"] for f in figures] == [shape for shape, _ in PAYLOAD_SHAPES]
    assert all(50_000 < f["bytes"] <= 65_536 and f["best_ms"] > 0 for f in figures)


def test_plot_draws_a_png_and_the_runs_carry_their_storage_samples(migrated_db, tmp_path):
    png = tmp_path / "bench.png"
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "claim-complete", "--workers", "1,2",
        "--duration", "2", "--repeats", "1", "--plot", str(png), "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    document = json.loads(result.stdout)
    for r in document["runs"]:
        # a sample at the start, one per second, one at the end: sizes in bytes, and the
        # claim + complete churn leaves dead tuples in the side's tables
        assert len(r["storage"]) >= 3 and r["storage"][0]["t"] == 0
        assert all(s["table_bytes"] > 0 and s["index_bytes"] > 0 for s in r["storage"])
    assert any(s["dead_tuples"] > 0 for r in document["runs"] for s in r["storage"])
    # runs shorter than two minutes have no first/last-minute ratio
    assert document["summary"][0]["keel_last_over_first_minute"] is None


def test_plot_without_matplotlib_is_refused_before_any_run(migrated_db, tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--duration", "30",
        "--plot", str(tmp_path / "x.png"), env={"PYTHONPATH": str(shadow.parent)},
    )  # fmt: skip
    assert result.returncode == 5, result.stderr
    assert "pip install 'agentkeel[plot]'" in result.stderr
    assert not (tmp_path / "x.png").exists()
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))


def test_a_bad_worker_list_is_a_usage_error(migrated_db):
    result = run_agentkeel("bench", "--dsn", migrated_db, "--workers", "0,x")
    assert result.returncode == 2
    assert "--workers" in result.stderr


def test_the_noisy_workload_serves_the_other_tenant_and_leaves_nothing_behind(migrated_db):
    """--workload noisy, at small sizes: B's task claims return B's tasks past A's locked
    ones, and B's message comes with the first outbox claim after A's 500 (a claim that
    serves oldest first needs six); nothing is left behind."""
    before = leftovers(migrated_db)
    results = run_noisy_bench(migrated_db, locked=(0, 500), due=(0, 500))
    assert [(m.noise, m.claims_until_served) for m in results] == [
        (0, 1), (500, 1), (0, 1), (500, 1)
    ]  # fmt: skip
    assert all(0 < m.p50_ms <= m.max_ms for m in results)
    assert leftovers(migrated_db) == before


def test_the_pgbench_driver_runs_every_workload_on_both_sides(migrated_db):
    """--driver pgbench: the same workloads as pgbench scripts. Each side did its work (the
    claims count the tasks moved to done, the rest pgbench's transactions), the slices add
    up to the operations, storage is sampled, and the keel side's server time per function
    was read (the --dsn role is a superuser here, so the bench logins track functions):
    every transition of the transition workload is one transition_task call."""
    from agentkeel.bench_pgbench import find_pgbench

    pgbench = find_pgbench()
    if pgbench is None:
        pytest.skip("no pgbench beside the server binaries or on PATH")
    runs = run(migrated_db, list(WORKLOAD_NAMES), [2], duration=1.0, repeats=1, pgbench=pgbench)
    assert {(r.workload, r.side, r.driver) for r in runs} == {
        (w, side, "pgbench") for w in WORKLOAD_NAMES for side in ("floor", "keel")
    }
    assert all(r.ops > 0 and r.latencies_ms and sum(r.slices) == r.ops for r in runs)
    assert all(len(r.storage) >= 2 for r in runs)
    keel = {r.workload: r for r in runs if r.side == "keel"}
    calls = {name.split("(")[0]: c for name, (c, _, _) in keel["transition"].functions.items()}
    assert calls["keel.transition_task"] == keel["transition"].ops
    assert "keel.claim_next_task" in {n.split("(")[0] for n in keel["claim-complete"].functions}
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))


def test_the_command_reports_both_drivers(migrated_db):
    from agentkeel.bench_pgbench import find_pgbench

    if find_pgbench() is None:
        pytest.skip("no pgbench beside the server binaries or on PATH")
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--workers", "1",
        "--duration", "1", "--repeats", "1", "--driver", "both", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [(s["workload"], s["driver"]) for s in document["summary"]] == [
        ("reserve", "python"),
        ("reserve", "pgbench"),
    ]
    human = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "reserve", "--workers", "1",
        "--duration", "1", "--repeats", "1",
    )  # fmt: skip
    assert human.returncode == 0, human.stderr
    assert "pgbench" in human.stdout and "reserve_operation" in human.stdout


def test_the_embedded_bench_names_the_statements_inside_the_functions():
    """Without --dsn the bench's own cluster loads pg_stat_statements (where the server's
    packages have it), so the keel side's runs name the statements inside the keel
    functions: the transition's outbox insert and pending-message count among them."""
    from agentkeel.embedded import find_bindir

    lib = find_bindir().parent / "lib"
    if not any((lib / f"pg_stat_statements{x}").exists() for x in (".so", ".dylib")):
        pytest.skip(f"no pg_stat_statements library in {lib}")
    result = run_agentkeel(
        "bench", "--workload", "transition", "--workers", "2", "--duration", "1",
        "--repeats", "1", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [keel] = [r for r in json.loads(result.stdout)["runs"] if r["side"] == "keel"]
    queries = " ".join(s["query"] for s in keel["statements"])
    assert "keel.outbox" in queries and all(s["calls"] > 0 for s in keel["statements"])


def test_a_claim_run_that_uses_every_row_says_so(migrated_db, monkeypatch):
    """A claim run that claimed every row loaded for it before its end is flagged
    (exhausted; `(ran out)` in the table): its ops/s is less than it could do."""
    import agentkeel.workloads as workloads

    monkeypatch.setattr(workloads, "rows_for", lambda duration, workers: 50)
    runs = run(migrated_db, ["claim-complete", "reserve"], [2], duration=1.0, repeats=1)
    flags = {(r.workload, r.side): r.exhausted for r in runs}
    assert flags == {
        ("claim-complete", "floor"): True,
        ("claim-complete", "keel"): True,
        ("reserve", "floor"): False,
        ("reserve", "keel"): False,
    }
    assert all(r.ops == 50 for r in runs if r.workload == "claim-complete")


def test_sigterm_with_a_dsn_removes_what_the_bench_made(migrated_db):
    """SIGTERM (a supervisor's stop) during a run on --dsn ends the bench with 130 and
    removes its roles, schema, tenant and workflow, as Ctrl-C does."""
    bench = subprocess.Popen(
        [*AGENTKEEL, "bench", "--dsn", migrated_db, "--workload", "claim-complete",
         "--workers", "2", "--duration", "60", "--repeats", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def running() -> bool:
        """A run is on: pgbench's sessions, or (the Python driver) the worker login's."""
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            row = conn.execute(
                "select count(*) from pg_stat_activity where datname = current_database()"
                " and (application_name = 'pgbench' or usename like 'bench_worker%')"
            ).fetchone()
        return bool(row and row[0]) or bench.poll() is not None

    try:
        wait_for(running, "the bench's first run to start")
        assert bench.poll() is None, bench.stderr.read() if bench.stderr else ""
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(120) == 130
    finally:
        if bench.poll() is None:
            bench.kill()
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))


def test_the_worker_workload_runs_both_runtimes_and_leaves_nothing(migrated_db):
    """--workload worker: the agentkeel worker and procrastinate's each finish every one of
    their no-op tasks (a run that finished none would report what it liked), alternating,
    and nothing is left behind."""
    result = run_agentkeel(
        "bench", "--dsn", migrated_db, "--workload", "worker", "--worker-tasks", "200",
        "--workers", "4", "--repeats", "1", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["worker"]
    assert [(f["runtime"], f["tasks"], f["note"]) for f in figures] == [
        ("agentkeel worker", 200, ""), ("procrastinate worker", 200, "")
    ]  # fmt: skip
    assert all(f["per_second"] > 0 for f in figures)
    assert leftovers(migrated_db) == ((0,), (0,), (0,), (0,))
