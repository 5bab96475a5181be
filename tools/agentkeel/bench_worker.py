"""`agentkeel bench --workload worker`: the worker runtime's tasks per second with a handler
that does nothing, beside procrastinate's worker running a task that does nothing, in the
same database, at the same concurrency.

Each side is timed from the worker's start until every one of its tasks or jobs is done:
claims, the handler's thread, the outcome's guarded transition and its event on agentkeel's
side; fetch, the task and finish on procrastinate's. The keel side runs as a login in
keel_worker, so row-level security and the lease checks are part of the figure.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import conninfo, sql

from agentkeel.bench import _remove_tenant
from agentkeel.client import Keel, set_tenant_context
from agentkeel.worker import Config, Registry, Worker

EDGES = [("queued", "queued"), ("queued", "done"), ("queued", "failed")]


@dataclass(frozen=True)
class WorkerMeasurement:
    runtime: str
    concurrency: int
    tasks: int
    seconds: float | None
    note: str = ""

    @property
    def per_second(self) -> float | None:
        return None if not self.seconds else self.tasks / self.seconds


def _wait_done(
    count: Callable[[], int], total: int, thread: threading.Thread, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while count() < total:
        if not thread.is_alive():
            raise RuntimeError("the worker stopped before its tasks were done")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not finish {total} tasks in {timeout:g} s")
        time.sleep(0.01)


def run_keel(dsn: str, tasks: int, concurrency: int) -> WorkerMeasurement:
    """agentkeel worker, a no-op handler; dsn: the owner (makes and removes its login)."""
    suffix = uuid.uuid4().hex[:8]
    login, workflow, tenant = f"bench_worker_{suffix}", f"bench-worker-{suffix}", uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(
            sql.SQL("create role {} login in role keel_worker").format(sql.Identifier(login))
        )
        keel = Keel(owner)
        keel.define_workflow(workflow, 1, "queued", EDGES)
        keel.create_tenant("agentkeel-bench-worker", tenant)
        with keel.transaction(tenant) as tx:
            tx.execute(
                "insert into keel.tasks (tenant_id, workflow, workflow_version, state, wake_at)"
                " select %s, %s, 1, 'queued', now() from generate_series(1, %s)",
                (tenant, workflow, tasks),
            )
            tx.execute("analyze keel.tasks")
    registry = Registry()
    registry.handler(workflow)(lambda ctx: "done")
    logger = logging.getLogger("agentkeel.bench.worker")
    logger.setLevel(logging.ERROR)
    worker = Worker(
        Config(
            dsn=conninfo.make_conninfo(dsn, user=login),
            concurrency=concurrency,
            poll_interval=0.01,
            progress_interval=3600,
        ),
        registry,
        logger,
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as watcher:

            def done() -> int:
                with watcher.transaction():
                    set_tenant_context(watcher, tenant)
                    row = watcher.execute(
                        "select count(*) from keel.tasks where tenant_id = %s and state = 'done'",
                        (tenant,),
                    ).fetchone()
                return int(row[0]) if row else 0

            thread = threading.Thread(target=worker.run, daemon=True)
            started = time.perf_counter()
            thread.start()
            _wait_done(done, tasks, thread, timeout=600)
            seconds = time.perf_counter() - started
            worker.stop()
            thread.join(timeout=60)
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            _remove_tenant(owner, tenant)
            owner.execute("delete from keel.workflows where workflow = %s", (workflow,))
            owner.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(login)))
    return WorkerMeasurement("agentkeel worker", concurrency, tasks, seconds)


def run_procrastinate(dsn: str, tasks: int, concurrency: int) -> WorkerMeasurement:
    """procrastinate's worker running a no-op task, in a schema of its own in dsn's
    database (removed after)."""
    try:
        import procrastinate
    except ImportError:
        return WorkerMeasurement(
            "procrastinate worker",
            concurrency,
            tasks,
            None,
            "procrastinate is not installed: pip install 'agentkeel[peers]'",
        )
    from agentkeel.workloads import _peer_schema

    schema = f"agentkeel_bench_peer_{uuid.uuid4().hex[:8]}"
    peer = conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(sql.SQL("create schema {}").format(sql.Identifier(schema)))
    try:
        with psycopg.connect(peer, autocommit=True) as conn:
            conn.execute(_peer_schema().encode())
            conn.execute(
                "insert into procrastinate_jobs (queue_name, task_name, args)"
                " select 'default', 'noop', '{}' from generate_series(1, %s)",
                (tasks,),
            )
            conn.execute("analyze procrastinate_jobs")
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=peer))

        @app.task(name="noop")
        def noop() -> None:
            return None

        logging.getLogger("procrastinate").setLevel(logging.ERROR)
        started = time.perf_counter()  # run_worker opens the app and its pool, as ours does
        app.run_worker(
            concurrency=concurrency,
            wait=False,
            listen_notify=False,
            install_signal_handlers=False,
        )
        seconds = time.perf_counter() - started
        with psycopg.connect(peer, autocommit=True) as conn:
            row = conn.execute(
                "select count(*) from procrastinate_jobs where status = 'succeeded'"
            ).fetchone()
        finished = int(row[0]) if row else 0
        note = "" if finished == tasks else f"only {finished} of {tasks} jobs succeeded"
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(sql.SQL("drop schema {} cascade").format(sql.Identifier(schema)))
    return WorkerMeasurement("procrastinate worker", concurrency, tasks, seconds, note)


def run_worker_bench(
    dsn: str, tasks: int = 2000, concurrency: int = 8, repeats: int = 2
) -> list[WorkerMeasurement]:
    """Both runtimes, alternating, repeats times each."""
    results: list[WorkerMeasurement] = []
    for _ in range(repeats):
        results.append(run_keel(dsn, tasks, concurrency))
        results.append(run_procrastinate(dsn, tasks, concurrency))
    return results
