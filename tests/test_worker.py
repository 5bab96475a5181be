"""The worker runtime (agentkeel.worker, `agentkeel worker`) against a real database: outcomes
as guarded transitions, retries with backoff, a worker SIGKILLed mid-step, a paused worker
whose lease was taken over, graceful shutdown; the same flow through PgBouncer in transaction
mode and on the Citus cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

import citus_cluster
from agentkeel.client import Keel
from agentkeel.client.rows import TaskEvent
from agentkeel.worker import (
    Cancelled,
    Config,
    Context,
    Fail,
    MoveTo,
    Registry,
    Retry,
    Snooze,
    Worker,
)
from agentkeel.worker.attempts import backoff, runs_so_far
from agentkeel.worker.runtime import missing_edges
from conftest import AGENTKEEL, REPO, run_agentkeel

APPS = Path(__file__).parent / "worker_apps"
AGENT_APP = f"{APPS / 'agent_app.py'}:registry"
EDGES = [("queued", "queued"), ("queued", "done"), ("queued", "failed")]


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    """Poll until condition() is truthy (a condition, not a speed: generous on a busy box)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def make_login(admin: str, *groups: str) -> str:
    name = f"akt_worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("create role {} login in role {}").format(
                sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, groups))
            )
        )
    return name


@pytest.fixture
def worker_db(migrated_db: str) -> Iterator[str]:
    """A migrated database and the DSN of a login in keel_app and keel_worker."""
    name = make_login(migrated_db, "keel_app", "keel_worker")
    try:
        yield conninfo.make_conninfo(migrated_db, user=name)
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


@dataclass(frozen=True)
class Target:
    login: str  # a login in keel_app and keel_worker
    owner: str  # who defines workflows (on Citus the owner: workflows is a reference table)


@pytest.fixture(params=["postgres", "pgbouncer", pytest.param("citus", marks=pytest.mark.citus)])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """Directly, through PgBouncer in transaction mode (round robin over backends), or on
    the Citus cluster's coordinator."""
    if request.param == "citus":
        admin = request.getfixturevalue("citus_keel")
        name = make_login(admin, "keel_app", "keel_worker")
        try:
            yield Target(conninfo.make_conninfo(admin, user=name), admin)
        finally:
            citus_cluster.drop_roles(request.getfixturevalue("citus_admin_dsn"), [name])
        return
    dsn = request.getfixturevalue("worker_db")
    if request.param == "pgbouncer":
        dsn = request.getfixturevalue("through_pgbouncer")(dsn, round_robin=True)
    yield Target(dsn, dsn)


def keel(dsn: str) -> Keel:
    return Keel(psycopg.connect(dsn, autocommit=True, prepare_threshold=None))


def events(dsn: str, tenant: uuid.UUID, task: uuid.UUID) -> list[TaskEvent]:
    k = keel(dsn)
    try:
        return k.task_events(tenant, task)
    finally:
        k.conn.close()


class Running:
    """A Worker run in a thread of this process, stopped on exit."""

    def __init__(self, dsn: str, registry: Registry, **config: Any) -> None:
        self.worker = Worker(Config(dsn=dsn, poll_interval=0.05, **config), registry)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the worker did not stop"


def test_every_outcome_is_a_guarded_transition_with_its_event(target):
    """Through each target: a handler's returned state, a retry with a growing backoff up
    to max_attempts and then the failed state, Fail at once, a snooze that does not count
    as an attempt, an async handler with async steps; each outcome is one event."""
    owner = keel(target.owner)
    workflow = f"wk_{uuid.uuid4().hex[:6]}"
    owner.define_workflow(workflow, 1, "queued", EDGES)
    owner.define_workflow(f"{workflow}_async", 1, "queued", EDGES)
    owner.conn.close()
    app = keel(target.login)
    tenant = app.create_tenant("worker-tests").tenant_id
    tasks = {
        k: app.create_task(tenant, workflow, 1, metadata={"kind": k}).task_id
        for k in ("ok", "flaky", "fail", "snooze")
    }
    tasks["async"] = app.create_task(tenant, f"{workflow}_async", 1).task_id
    runs: dict[str, int] = {}
    base = timedelta(seconds=0.2)
    registry = Registry()

    @registry.handler(workflow, max_attempts=3, backoff_base=base)
    def handle(ctx: Context) -> str:
        kind = ctx.metadata["kind"]
        runs[kind] = runs.get(kind, 0) + 1
        first = ctx.step("first", {"kind": kind}, lambda: {"ran": kind})
        assert first == {"ran": kind}
        if kind == "flaky":
            raise RuntimeError(f"run {runs[kind]} failed")
        if kind == "fail":
            raise Fail("nothing to do")
        if kind == "snooze" and runs[kind] == 1:
            raise Snooze(timedelta(seconds=0.2))
        return "done"

    async def handle_async(ctx: Context) -> str:
        answer = await ctx.step_async("model", {"q": 1}, _async_answer)
        assert answer == {"answer": 42}
        await asyncio.sleep(0.01)
        return "done"

    registry.handler(f"{workflow}_async")(handle_async)

    ends = {"ok": "done", "flaky": "failed", "fail": "failed", "snooze": "done", "async": "done"}
    with Running(target.login, registry, concurrency=2) as worker:
        wait_for(
            lambda: all(app.get_task(tenant, tasks[k]).state == ends[k] for k in ends),  # type: ignore[union-attr]
            "the tasks to end",
        )

    flaky = events(target.login, tenant, tasks["flaky"])
    retries = [e for e in flaky if e.event_type == "RETRY_SCHEDULED"]
    assert [e.payload["attempt"] for e in retries] == [1, 2]  # type: ignore[index]
    for e in retries:
        n = e.payload["attempt"]  # type: ignore[index]
        assert 0 <= e.payload["retry_in_seconds"] <= base.total_seconds() * 2 ** (n - 1)  # type: ignore[index]
        assert (e.from_state, e.to_state) == ("queued", "queued")
        # Not run again before its backoff passed: the next run's reuse event is later.
        later = [x for x in flaky if x.seq > e.seq]
        waited = (later[0].created_at - e.created_at).total_seconds()
        assert waited >= e.payload["retry_in_seconds"] - 0.05  # type: ignore[index]
    last = flaky[-1]
    assert (last.event_type, last.to_state) == ("TASK_FAILED", "failed")
    assert last.payload == {  # type: ignore[comparison-overlap]
        "attempts": 3,
        "error": {"type": "RuntimeError", "message": "run 3 failed"},
    }
    assert runs["flaky"] == 3
    assert [e.event_type for e in flaky].count("STEP_RESULT_REUSED") == 2

    failed = events(target.login, tenant, tasks["fail"])
    assert [(e.event_type, e.to_state) for e in failed[1:]] == [("TASK_FAILED", "failed")]
    assert runs["fail"] == 1

    snoozed = events(target.login, tenant, tasks["snooze"])
    assert [e.event_type for e in snoozed[1:]] == [
        "TASK_SNOOZED",
        "STEP_RESULT_REUSED",
        "transition",
    ]
    ok = events(target.login, tenant, tasks["ok"])
    assert [(e.event_type, e.to_state) for e in ok[1:]] == [("transition", "done")]
    async_events = events(target.login, tenant, tasks["async"])
    assert async_events[-1].to_state == "done"
    assert worker.stats.refused_writes == 0 and worker.stats.errors == 0
    app.conn.close()


async def _async_answer() -> dict[str, int]:
    await asyncio.sleep(0.01)
    return {"answer": 42}


# -- `agentkeel worker` as a process ---------------------------------------------------------
class AgentWorld:
    """A database with the "agent" workflow of tests/worker_apps/agent_app.py, a tenant, and
    the worker processes a test starts (each stopped at the end)."""

    def __init__(self, target: Target, calls: Path) -> None:
        self.dsn = target.login
        self.calls = calls
        with psycopg.connect(target.owner, autocommit=True) as conn:
            Keel(conn).define_workflow("agent", 1, "queued", EDGES)
        self.app = keel(self.dsn)
        self.tenant = self.app.create_tenant("agent-tests").tenant_id
        self.processes: list[subprocess.Popen[str]] = []

    def task(self, block: str | None = None) -> uuid.UUID:
        metadata = {"block": block} if block else {}
        return self.app.create_task(self.tenant, "agent", 1, metadata=metadata).task_id

    def start(self, *args: str, lease: float = 1.0) -> subprocess.Popen[str]:
        env = {**os.environ, "AGENTKEEL_TEST_CALLS": str(self.calls)}
        env.pop("AGENTKEEL_DSN", None)
        process = spawn(
            [
                *AGENTKEEL,
                "worker",
                "--dsn",
                self.dsn,
                "--app",
                AGENT_APP,
                "--lease",
                str(lease),
                "--poll-interval",
                "0.05",
                "--log-format",
                "json",
                *args,
            ],
            self.calls,
            env,
        )
        self.processes.append(process)
        return process

    def provider_calls(self, task: uuid.UUID) -> list[str]:
        path = self.calls / f"{task}.log"
        return path.read_text().split() if path.exists() else []

    def waiting(self, task: uuid.UUID, step: str) -> bool:
        return (self.calls / f"{task}.{step}.waiting").exists()

    def go(self, task: uuid.UUID, step: str) -> None:
        (self.calls / f"{task}.{step}.go").touch()

    def state(self, task: uuid.UUID) -> Any:
        return self.app.get_task(self.tenant, task)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=60)
        self.app.conn.close()


@pytest.fixture
def world(target: Target, tmp_path: Path) -> Iterator[AgentWorld]:
    """The agent app's world, on each target."""
    w = AgentWorld(target, tmp_path)
    try:
        yield w
    finally:
        w.close()


# Each worker process's stderr, in a file: a pipe nobody reads until the end would fill
# and block the worker's logging (and with it its signal handler) on a busy run.
LOGS: dict[int, Path] = {}


def spawn(argv: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    path = folder / f"worker-{uuid.uuid4().hex[:8]}.log"
    with path.open("w") as log:
        process = subprocess.Popen(
            argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True
        )
    LOGS[process.pid] = path
    return process


def stop(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, list[dict[str, Any]]]:
    """SIGTERM, then the exit code and the JSON log lines."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        text = LOGS[process.pid].read_text()
        raise AssertionError(f"the worker did not stop on SIGTERM; its log:\n{text}") from None
    text = LOGS[process.pid].read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return process.returncode, lines


def test_a_worker_killed_mid_step_is_resumed_with_its_completed_steps_reused(world):
    """SIGKILL during the second step's provider call; a second worker takes the task after
    the lease expires: the first step is reused (one provider call), the killed step runs
    again (its first call was never recorded), and the task ends in one terminal state."""
    task = world.task(block="call")
    first = world.start()
    wait_for(lambda: world.waiting(task, "call"), "the worker to reach the second step")
    first.kill()
    first.communicate(timeout=60)
    world.go(task, "call")
    second = world.start()
    wait_for(lambda: world.state(task).state == "done", "the second worker to finish the task")
    assert stop(second)[0] == 0
    assert world.provider_calls(task) == ["plan", "call", "call", "answer"]
    history = events(world.dsn, world.tenant, task)
    reused = [e.payload["step_key"] for e in history if e.event_type == "STEP_RESULT_REUSED"]  # type: ignore[index]
    assert reused == ["plan"]
    assert [e.to_state for e in history if e.to_state in ("done", "failed")] == ["done"]
    attempts = world.app.list_step_attempts(world.tenant, task)
    assert sorted((a.step_key, a.status) for a in attempts) == [
        ("answer", "succeeded"),
        ("call", "abandoned"),
        ("call", "succeeded"),
        ("plan", "succeeded"),
    ]
    assert world.state(task).recovery_attempts == 1


def test_a_paused_worker_whose_lease_was_taken_over_stops_without_writing(world):
    """SIGSTOP the worker in a step's provider call past its lease, let another owner claim
    the task, SIGCONT: the handler is cancelled and the worker sends no write with its old
    token (refused_writes 0: it does not rely on the database's refusal); the step it was
    in stays open for the new owner."""
    task = world.task(block="call")
    paused = world.start("--concurrency", "1")
    wait_for(lambda: world.waiting(task, "call"), "the worker to reach the second step")
    old_token = world.state(task).fencing_token
    paused.send_signal(signal.SIGSTOP)
    try:
        thief = keel(world.dsn)
        claimed = wait_for(
            lambda: thief.claim_next_task("thief", workflow="agent"), "the lease to expire"
        )
        assert claimed.task_id == task and claimed.fencing_token > old_token
        world.go(task, "call")
    finally:
        paused.send_signal(signal.SIGCONT)
    wait_for(lambda: world.provider_calls(task) == ["plan", "call"], "the provider call")
    time.sleep(0.5)  # the handler's call returned: give it the chance to (wrongly) write
    code, logs = stop(paused)
    assert code == 0
    final = next(line for line in logs if line["event"] == "worker stopped")
    assert (final["lost"], final["refused_writes"], final["done"]) == (1, 0, 0)
    assert any(line["event"].startswith("task stopped") for line in logs)
    now = world.state(task)
    assert (now.lease_owner, now.fencing_token, now.state) == (
        "thief",
        claimed.fencing_token,
        "queued",
    )
    attempts = {a.step_key: a.status for a in world.app.list_step_attempts(world.tenant, task)}
    assert attempts == {"plan": "succeeded", "call": "running"}
    thief.conn.close()


def test_sigterm_lets_running_handlers_finish_and_loses_no_work(world):
    """Under load (12 tasks, 4 at a time), SIGTERM: the worker stops claiming, the running
    handlers finish, it exits 0 holding no lease; a second worker does the rest; every task
    ends done exactly once."""
    tasks = [world.task() for _ in range(12)]
    first = world.start("--concurrency", "4", "--shutdown-timeout", "60")
    wait_for(lambda: any(world.provider_calls(t) for t in tasks), "the first task to start")
    code, logs = stop(first)
    assert code == 0
    rows = [world.state(t) for t in tasks]
    assert all(r.lease_owner is None for r in rows)
    assert not any(line["event"] == "lease given back at shutdown" for line in logs)
    done_first = sum(r.state == "done" for r in rows)
    assert done_first >= 1
    second = world.start("--concurrency", "4")
    wait_for(lambda: all(world.state(t).state == "done" for t in tasks), "every task to end")
    assert stop(second)[0] == 0
    for t in tasks:
        history = events(world.dsn, world.tenant, t)
        assert [e.to_state for e in history if e.to_state == "done"] == ["done"]
        assert world.provider_calls(t) == ["plan", "call", "answer"]


def test_past_the_shutdown_timeout_the_leases_are_given_back_at_once(world):
    """Handlers stuck in a provider call when the shutdown timeout passes: their leases are
    released (due again now), nothing more is written for them, the worker exits 0, and
    another worker finishes the tasks with the steps done before reused."""
    tasks = [world.task(block="call") for _ in range(3)]
    first = world.start(
        "--concurrency", "3", "--shutdown-timeout", "0.2", "--progress-interval", "0.2", lease=30
    )
    for t in tasks:
        wait_for(lambda t=t: world.waiting(t, "call"), "every task to reach its second step")
    time.sleep(0.5)  # every slot is busy: the progress line still comes
    code, logs = stop(first)
    assert code == 0
    given_back = {
        line["task_id"] for line in logs if line["event"] == "lease given back at shutdown"
    }
    assert given_back == {str(t) for t in tasks}
    final = next(line for line in logs if line["event"] == "worker stopped")
    assert (final["released"], final["lost"], final["refused_writes"]) == (3, 0, 0)
    progress = [line for line in logs if line["event"] == "progress"]
    assert progress and all(p["running"] <= 3 and p["per_second"] >= 0 for p in progress)
    for t in tasks:
        row = world.state(t)
        assert row.lease_owner is None and row.state == "queued"
        world.go(t, "call")
    second = world.start("--concurrency", "3")
    wait_for(lambda: all(world.state(t).state == "done" for t in tasks), "every task to end")
    assert stop(second)[0] == 0
    for t in tasks:
        assert world.provider_calls(t) == ["plan", "call", "call", "answer"]


def test_cli_refusals_are_one_line_with_their_exit_code(worker_db, tmp_path):
    """An --app that names nothing is usage (2); a workflow without the edges the worker
    writes is refused before anything is claimed (3), naming the missing edges."""
    result = run_agentkeel("worker", "--dsn", worker_db, "--app", "no_such_module:registry")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "agentkeel: error: --app 'no_such_module:registry': no module named 'no_such_module'"
    )
    bare = f"{APPS / 'agent_app.py'}:nothing"
    result = run_agentkeel("worker", "--dsn", worker_db, "--app", bare)
    assert result.returncode == 2, result.stderr
    assert "importing it raised KeyError: 'AGENTKEEL_TEST_CALLS'" in result.stderr
    env = {"AGENTKEEL_TEST_CALLS": str(tmp_path)}
    result = run_agentkeel("worker", "--dsn", worker_db, "--app", bare, env=env)
    assert result.returncode == 2, result.stderr
    assert "module agent_app has no attribute 'nothing'" in result.stderr
    result = run_agentkeel(
        "worker", "--dsn", worker_db, "--app", f"{APPS / 'agent_app.py'}:STEPS", env=env
    )
    assert result.returncode == 2, result.stderr
    assert "agent_app.STEPS is a tuple, not an agentkeel.worker.Registry" in result.stderr
    app = keel(worker_db)
    app.define_workflow("agent", 1, "queued", [("queued", "running"), ("running", "done")])
    tenant = app.create_tenant("t").tenant_id
    task = app.create_task(tenant, "agent", 1).task_id
    result = run_agentkeel("worker", "--dsn", worker_db, "--app", AGENT_APP, env=env)
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("\n") == 1
    assert (
        "agent v1 needs queued -> failed, queued -> queued, running -> failed, running -> running"
        in result.stderr
    )
    assert app.get_task(tenant, task).lease_owner is None  # type: ignore[union-attr]
    app.conn.close()


# -- the pure parts --------------------------------------------------------------------------
def test_backoff_is_full_jitter_under_a_doubling_cap():
    base, cap = timedelta(seconds=1), timedelta(seconds=10)
    assert [backoff(n, base, cap, rng=lambda: 1.0).total_seconds() for n in (1, 2, 3, 4, 5)] == [
        1,
        2,
        4,
        8,
        10,
    ]
    assert backoff(3, base, cap, rng=lambda: 0.0) == timedelta(0)
    assert backoff(10_000, base, timedelta(hours=1), rng=lambda: 1.0) == timedelta(hours=1)


def _event(seq: int, kind: str, a: str | None, b: str, payload: Any = None) -> TaskEvent:
    return TaskEvent(
        uuid.uuid4(),
        uuid.uuid4(),
        seq,
        kind,
        a,
        b,
        seq,
        "w",
        None,
        None,
        None,
        payload or {},
        None,
        None,
        None,
    )  # type: ignore[arg-type]


def test_the_attempt_is_read_back_to_the_last_move():
    created = _event(1, "created", None, "queued")
    retry = _event(2, "RETRY_SCHEDULED", "queued", "queued", {"attempt": 2})
    reuse = _event(3, "STEP_RESULT_REUSED", "queued", "queued")
    snooze = _event(4, "TASK_SNOOZED", "queued", "queued")
    recovered = _event(5, "RECOVERED", "queued", "queued")
    moved = _event(6, "transition", "queued", "running")
    assert runs_so_far([created]) == 0
    assert runs_so_far([created, retry, reuse, snooze, recovered]) == 2
    assert runs_so_far([created, retry, moved, reuse]) == 0
    assert runs_so_far([reuse, snooze]) is None  # look further back


def test_missing_edges_cover_every_state_a_handler_may_leave_its_task_in():
    registry = Registry()
    registry.handler("w")(lambda ctx: "done")
    states = {
        "queued": (False, ["running"]),
        "running": (False, ["running", "done", "failed"]),
        "done": (True, []),
        "failed": (True, []),
    }
    assert missing_edges(registry, "w", states) == ["queued -> failed", "queued -> queued"]
    running = Registry()
    running.handler("w", "running", max_attempts=1)(lambda ctx: "done")
    assert missing_edges(running, "w", states) == []
    mapped = Registry()
    mapped.handler("w", "running", errors={ValueError: "rejected"})(lambda ctx: "done")
    assert missing_edges(mapped, "w", states) == ["running -> rejected"]


# -- docs/worker.md ----------------------------------------------------------------------------
def test_the_guide_runs_as_written(worker_db, migrated_db, tmp_path):
    """docs/worker.md's ten minutes, from its own blocks: the workflow, the module, the
    command, the task; the worker SIGKILLed during the second model call and started again:
    the outline is reused, the killed draft runs again, the task ends done."""
    page = (REPO / "docs" / "worker.md").read_text()
    sql_blocks = re.findall(r"```sql\n(.*?)```", page, flags=re.DOTALL)
    module = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]
    command = shlex.split(re.findall(r"```sh\n(.*?)```", page, flags=re.DOTALL)[0])
    assert command[:2] == ["agentkeel", "worker"]
    (tmp_path / "summarize_worker.py").write_text(module)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(sql_blocks[0])
    with psycopg.connect(worker_db, autocommit=True) as conn:
        statements = [s for s in sql_blocks[1].split(";") if s.strip()]
        conn.execute(statements[0])
        task = conn.execute(statements[1]).fetchone()[0]  # type: ignore[index]
    env = {**os.environ, "AGENTKEEL_DSN": worker_db}
    argv = [
        *AGENTKEEL,
        *[env["AGENTKEEL_DSN"] if a == "$AGENTKEEL_DSN" else a for a in command[1:]],
    ]
    bill = tmp_path / "model-calls.log"

    def calls() -> list[str]:
        return [line.split()[0] for line in bill.read_text().splitlines()] if bill.exists() else []

    first = spawn(argv, tmp_path, env)
    try:
        wait_for(lambda: calls() == ["outline", "draft"], "the draft call")
    finally:
        first.kill()
        first.wait(timeout=60)
    second = spawn(argv, tmp_path, env)
    try:
        tenant = uuid.UUID("0190aaaa-0000-7000-8000-000000000001")
        app = keel(worker_db)
        wait_for(lambda: app.get_task(tenant, task).state == "done", "the task to end")  # type: ignore[union-attr]
    finally:
        code, _ = stop(second)
    assert code == 0
    assert calls() == ["outline", "draft", "draft", "review"]
    history = app.task_events(tenant, task)
    assert [e.event_type for e in history] == ["created", "STEP_RESULT_REUSED", "transition"]
    assert history[-1].payload["summary"].startswith("<review of <draft from")  # type: ignore[index]
    drafts = [a.status for a in app.list_step_attempts(tenant, task) if a.step_key == "draft"]
    assert sorted(drafts) == ["abandoned", "succeeded"]
    app.conn.close()


def _workflow(owner: str, edges: list[tuple[str, str]]) -> str:
    name = f"wk_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(owner, autocommit=True) as conn:
        Keel(conn).define_workflow(name, 1, "queued", edges)
    return name


def test_an_outcome_the_database_refuses_fails_the_task_and_gives_the_lease_back(worker_db):
    """A handler's message with a NUL byte is stored escaped (jsonb refuses NUL); a MoveTo
    whose payload the payload check refuses (a password key) and a retry later than
    max_wake_delay fail the task with the refusal, instead of leaving its lease held and
    the task running again and again."""
    workflow = _workflow(worker_db, [*EDGES, ("queued", "rejected")])
    app = keel(worker_db)
    tenant = app.create_tenant("refusals").tenant_id
    kinds = ("nul", "secret", "far")
    tasks = {k: app.create_task(tenant, workflow, 1, metadata={"kind": k}).task_id for k in kinds}
    runs: dict[str, int] = {}
    registry = Registry()

    @registry.handler(workflow, max_attempts=2, backoff_base=timedelta(seconds=0.05))
    def handle(ctx: Context) -> str:
        kind = ctx.metadata["kind"]
        runs[kind] = runs.get(kind, 0) + 1
        if kind == "nul":
            raise RuntimeError("bad\x00byte \ud800")
        if kind == "secret":
            raise MoveTo("rejected", {"password": "hunter2"})
        raise Retry("later", delay=timedelta(days=400))

    with Running(worker_db, registry, concurrency=3) as worker:
        wait_for(
            lambda: all(app.get_task(tenant, t).state == "failed" for t in tasks.values()),  # type: ignore[union-attr]
            "every task to fail",
        )
    assert runs == {"nul": 2, "secret": 1, "far": 1}
    nul = events(worker_db, tenant, tasks["nul"])
    assert nul[-1].payload["error"]["message"] == "bad\\u0000byte \\ud800"  # type: ignore[index]
    for kind in ("secret", "far"):
        last = events(worker_db, tenant, tasks[kind])[-1]
        assert last.event_type == "TASK_FAILED"
        expected = (
            "event payload key $.password may carry a secret [22K02]"
            if kind == "secret"
            else "wake time "
        )
        message = last.payload["error"]["message"]  # type: ignore[index]
        assert message.startswith(f"the outcome was refused: {expected}"[:60]), message
    assert all(app.get_task(tenant, t).lease_owner is None for t in tasks.values())  # type: ignore[union-attr]
    assert worker.stats.errors == 0
    app.conn.close()


def test_a_write_waiting_on_a_lock_does_not_hold_up_other_leases(worker_db, migrated_db):
    """One task's step waits on its row, locked by another session, for longer than a
    lease; the other task's lease is still renewed, and it finishes in one run."""
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("locks").tenant_id
    stuck = app.create_task(tenant, workflow, 1, metadata={"kind": "stuck"}).task_id
    free = app.create_task(tenant, workflow, 1, metadata={"kind": "free"}).task_id
    started: dict[str, int] = {"stuck": 0, "free": 0}
    claimed, locked = threading.Event(), threading.Event()
    locker = psycopg.connect(migrated_db)
    registry = Registry()

    @registry.handler(workflow)
    def handle(ctx: Context) -> str:
        kind = ctx.metadata["kind"]
        started[kind] += 1
        if kind == "stuck":
            claimed.set()
            locked.wait(60)
            ctx.step("blocked", {}, lambda: {})  # waits on the locked row
        else:
            ctx.sleep(4.5)  # past the 3-second lease: only renewals keep it
        return "done"

    try:
        with Running(worker_db, registry, concurrency=2, lease=timedelta(seconds=3)):
            wait_for(claimed.is_set, "the stuck task's claim")
            locker.execute("select 1 from keel.tasks where task_id = %s for update", (stuck,))
            locked.set()
            wait_for(lambda: app.get_task(tenant, free).state == "done", "the free task")  # type: ignore[union-attr]
            locker.rollback()
            wait_for(lambda: app.get_task(tenant, stuck).state == "done", "the stuck task")  # type: ignore[union-attr]
    finally:
        locker.close()
    assert started["free"] == 1
    assert app.get_task(tenant, free).recovery_attempts == 0  # type: ignore[union-attr]
    app.conn.close()


def test_the_attempt_starts_again_at_one_after_the_handler_moved_its_task(worker_db):
    """A handler that retried once in queued, then moves its task to working and fails
    there: that is the first failure in working (a retry), not its second."""
    workflow = _workflow(
        worker_db,
        [
            *EDGES,
            ("queued", "working"),
            ("working", "working"),
            ("working", "failed"),
            ("working", "done"),
        ],
    )
    app = keel(worker_db)
    tenant = app.create_tenant("moves").tenant_id
    task = app.create_task(tenant, workflow, 1).task_id
    seen: list[tuple[str, int]] = []
    registry = Registry()

    @registry.handler(workflow, max_attempts=2, backoff_base=timedelta(seconds=0.05))
    def handle(ctx: Context) -> str:
        seen.append((ctx.state, ctx.attempt))
        if len(seen) == 1:
            raise RuntimeError("first")
        if len(seen) == 2:
            ctx.transition("working")
            raise RuntimeError("second")
        return "done"

    with Running(worker_db, registry):
        wait_for(lambda: app.get_task(tenant, task).state == "done", "the task to end")  # type: ignore[union-attr]
    assert seen == [("queued", 1), ("queued", 2), ("working", 2)]
    moves = [
        (e.event_type, e.to_state, (e.payload or {}).get("attempt"))  # type: ignore[union-attr]
        for e in events(worker_db, tenant, task)[1:]
    ]
    assert moves == [
        ("RETRY_SCHEDULED", "queued", 1),
        ("transition", "working", None),
        ("RETRY_SCHEDULED", "working", 1),
        ("transition", "done", None),
    ]
    app.conn.close()


# -- OpenTelemetry ------------------------------------------------------------------------------
def test_a_run_and_its_steps_are_spans_in_the_tasks_trace(worker_db):
    """With opentelemetry installed and a tracer provider set: the handler run is an
    invoke_agent span whose parent is the task's trace context, each step an execute_tool
    span inside it, marked reused or started; the task's events carry the same trace id."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # set once per process
        pytest.skip("another tracer provider was set in this process first")
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("traces").tenant_id
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    task = app.create_task(tenant, workflow, 1, trace_id=trace_id, span_id=span_id).task_id
    runs: list[int] = []
    registry = Registry()

    @registry.handler(workflow, backoff_base=timedelta(seconds=0.05))
    def handle(ctx: Context) -> str:
        runs.append(1)
        ctx.step("search", {"q": 1}, lambda: {"hits": 3})
        if len(runs) == 1:
            raise RuntimeError("once")
        return "done"

    with Running(worker_db, registry):
        wait_for(lambda: app.get_task(tenant, task).state == "done", "the task")  # type: ignore[union-attr]
    spans = exporter.get_finished_spans()
    agent = [s for s in spans if s.name == f"invoke_agent {workflow}"]
    tools = [s for s in spans if s.name == "execute_tool search"]
    assert len(agent) == 2 and len(tools) == 2
    for s in agent:
        assert s.context.trace_id == int(trace_id, 16)
        assert s.parent is not None and s.parent.span_id == int(span_id, 16)
        assert s.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert s.attributes["agentkeel.task_id"] == str(task)
    assert [t.attributes["agentkeel.step.outcome"] for t in tools] == ["started", "reused"]
    assert {t.parent.span_id for t in tools} == {s.context.span_id for s in agent}  # type: ignore[union-attr]
    assert not agent[0].status.is_ok and agent[1].status.is_ok
    assert {e.trace_id for e in app.task_events(tenant, task)} == {trace_id}
    app.conn.close()


def test_returned_states_are_written_in_batches(worker_db, migrated_db):
    """Runs that return their next state are settled by keel.transition_tasks, many in a
    call (River's batch completer): fewer calls than tasks, and no single-call transition;
    each task still has exactly its one event."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(
            sql.SQL("alter database {} set track_functions = 'pl'").format(sql.Identifier(name))
        )
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("batches").tenant_id
    tasks = [app.create_task(tenant, workflow, 1).task_id for _ in range(64)]
    gate = threading.Barrier(8, timeout=30)
    registry = Registry()

    @registry.handler(workflow)
    def handle(ctx: Context) -> str:
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()  # eight runs end together, as under load
        return "done"

    with Running(worker_db, registry, concurrency=8):
        wait_for(lambda: all(app.get_task(tenant, t).state == "done" for t in tasks), "the tasks")  # type: ignore[union-attr]
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("select pg_stat_force_next_flush()")
        calls = dict(
            conn.execute(
                "select funcname, calls from pg_stat_user_functions where schemaname = 'keel'"
                " and funcname in ('transition_tasks', 'transition_task')"
            ).fetchall()
        )
    assert calls.get("transition_task", 0) == 0
    assert 1 <= calls["transition_tasks"] < len(tasks)
    for t in tasks:
        assert [e.to_state for e in events(worker_db, tenant, t)] == ["queued", "done"]
    app.conn.close()


def test_refused_outcomes_under_load_neither_exhaust_the_pool_nor_lose_leases(worker_db):
    """200 runs at concurrency 4 returning a state their workflow has no edge to: each
    outcome is refused (55K02) and the task fails instead, writing from a connection taken
    before its lease's lock; the pool (2 x concurrency + 2) never runs dry, no lease is lost
    and no write is refused for a lost lease."""
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("refused-load").tenant_id
    with app.transaction(tenant) as tx:
        tx.execute(
            "select keel.create_task(%s, %s, 1) from generate_series(1, 200)", (tenant, workflow)
        )
    registry = Registry()
    registry.handler(workflow)(lambda ctx: "nowhere")
    with Running(worker_db, registry, concurrency=4) as worker:
        wait_for(lambda: worker.stats.failed == 200, "every task to fail")
    assert (worker.stats.lost, worker.stats.errors, worker.stats.refused_writes) == (0, 0, 0)
    app.conn.close()


def test_a_batch_the_database_refuses_whole_is_written_item_by_item(worker_db, migrated_db):
    """settings.max_batch_items lowered to 4 under a worker of concurrency 8 (claims and
    batches fit it), and one run returning a state jsonb cannot hold (a NUL byte): that
    task alone is not moved; every other task ends done after one run, none failed."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("update keel.settings set value = '4' where setting = 'max_batch_items'")
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("whole").tenant_id
    poison = app.create_task(tenant, workflow, 1, metadata={"poison": True}).task_id
    tasks = [app.create_task(tenant, workflow, 1).task_id for _ in range(24)]
    runs: dict[uuid.UUID, int] = {}
    gate = threading.Barrier(8, timeout=5)
    registry = Registry()

    @registry.handler(workflow)
    def handle(ctx: Context) -> str:
        runs[ctx.task_id] = runs.get(ctx.task_id, 0) + 1
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()  # runs end together: batches form
        return "done\x00" if ctx.metadata.get("poison") else "done"

    with Running(worker_db, registry, concurrency=8):
        wait_for(lambda: all(app.get_task(tenant, t).state == "done" for t in tasks), "the tasks")  # type: ignore[union-attr]
    assert all(runs[t] == 1 for t in tasks), runs
    assert app.get_task(tenant, poison).state == "queued"  # type: ignore[union-attr]
    app.conn.close()


def test_a_lock_timeout_in_a_batch_is_retried_as_the_single_call(worker_db, migrated_db):
    """A run returns done while another session holds its task's row for 1.5 s, past the
    login's 1 s lock_timeout: the batch refuses the item with a lock timeout (not one of
    agentkeel's refusals), so the item is written again as the single call, which gets the
    row once it is free. The task ends done after its one run: the timeout is not taken
    for a refusal of the outcome (which would fail the task)."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        login = conninfo.conninfo_to_dict(worker_db)["user"]
        conn.execute(
            sql.SQL("alter role {} set lock_timeout = '1s'").format(sql.Identifier(str(login)))
        )
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("lock-timeout").tenant_id
    task = app.create_task(tenant, workflow, 1).task_id
    returning, locked = threading.Event(), threading.Event()
    runs: list[int] = []
    registry = Registry()

    @registry.handler(workflow)
    def handle(ctx: Context) -> str:
        runs.append(1)
        returning.set()
        locked.wait(30)
        return "done"

    locker = psycopg.connect(migrated_db)
    try:
        with Running(worker_db, registry, lease=timedelta(seconds=30)):
            wait_for(returning.is_set, "the run")
            locker.execute("select 1 from keel.tasks where task_id = %s for update", (task,))
            locked.set()
            time.sleep(1.5)
            locker.rollback()
            wait_for(lambda: app.get_task(tenant, task).state != "queued", "the outcome")  # type: ignore[union-attr]
    finally:
        locker.close()
    assert app.get_task(tenant, task).state == "done"  # type: ignore[union-attr]
    assert len(runs) == 1
    assert [e.to_state for e in events(worker_db, tenant, task)] == ["queued", "done"]
    app.conn.close()


def test_a_handler_raising_systemexit_or_its_own_cancellation_is_retried(worker_db):
    """SystemExit from a handler's own code, and a Cancelled its lease never got, are errors
    like any (retries), not a lost lease: nothing is left leased. A handler that moved its
    task to a terminal state and also returns it has one outcome, counted done."""
    workflow = _workflow(worker_db, EDGES)
    app = keel(worker_db)
    tenant = app.create_tenant("escapes").tenant_id
    task = app.create_task(tenant, workflow, 1).task_id
    runs: list[int] = []
    registry = Registry()

    @registry.handler(workflow, backoff_base=timedelta(seconds=0.05))
    def handle(ctx: Context) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise SystemExit(2)
        if len(runs) == 2:
            raise Cancelled("the handler's own")
        ctx.transition("done")
        return "done"

    with Running(worker_db, registry) as worker:
        wait_for(lambda: app.get_task(tenant, task).state == "done", "the task")  # type: ignore[union-attr]
        wait_for(lambda: worker.stats.done == 1, "the count")
    kinds = [(e.event_type, e.to_state) for e in events(worker_db, tenant, task)[1:]]
    assert kinds == [
        ("RETRY_SCHEDULED", "queued"), ("RETRY_SCHEDULED", "queued"), ("transition", "done")
    ]  # fmt: skip
    assert (worker.stats.retried, worker.stats.lost, worker.stats.errors) == (2, 0, 0)
    assert app.get_task(tenant, task).lease_owner is None  # type: ignore[union-attr]
    app.conn.close()
