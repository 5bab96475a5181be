"""Racing worker processes against one database, recording a history for the checker.

Each worker process claims due tasks of one workflow, reserves an idempotency key, performs
a (recorded) effect only when it owns the reservation, sometimes dawdles past its lease,
completes the operation and moves the task queued -> running -> done with an outbox message
per transition. A chaos thread may terminate worker backends so that outcomes become
ambiguous; they are resolved afterwards with pg_xact_status().
"""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from agentkeel.client import Keel
from agentkeel.errors import KeelError
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant
from agentkeel_conformance.history import Verdict, check, load

APPLICATION_NAME = "agentkeel-conformance-race"


@dataclass(frozen=True)
class RaceConfig:
    dsn: str
    workflow: str
    tenant: uuid.UUID
    workers: int = 4
    seconds: float = 4.0
    tasks: int = 16
    lease_ms: int = 250
    chaos: bool = True
    options: str = ""


class _Recorder:
    def __init__(self, path: Path, worker: str) -> None:
        self.handle = path.open("a")
        self.worker = worker

    def __call__(self, **event: Any) -> None:
        event["worker"] = self.worker
        self.handle.write(json.dumps(event, default=str) + "\n")
        self.handle.flush()


def _call(conn: psycopg.Connection, record: _Recorder, op: str, fn: Any, **fields: Any) -> Any:
    """Run fn in a transaction of its own, recording invoke and its outcome."""
    xid = None
    try:
        with conn.transaction():
            row = conn.execute("select pg_current_xact_id()::text").fetchone()
            xid = row[0] if row else None
            record(type="invoke", op=op, xid=xid, **fields)
            result = fn()
        return result
    except KeelError as err:
        record(type="fail", op=op, xid=xid, error=err.name, **fields)
        return None
    except psycopg.OperationalError as err:
        record(type="info", op=op, xid=xid, error=str(err).splitlines()[0], **fields)
        raise


def _worker(config: RaceConfig, index: int, path: str, seed: int) -> None:
    name = f"w{index}"
    record = _Recorder(Path(path), name)
    rng = random.Random(seed)
    lease = timedelta(milliseconds=config.lease_ms)
    deadline = time.monotonic() + config.seconds
    conn: psycopg.Connection | None = None
    while time.monotonic() < deadline:
        try:
            if conn is None or conn.closed:
                conn = suite_connect(
                    config.dsn,
                    autocommit=True,
                    options=config.options,
                    application_name=f"{APPLICATION_NAME}-{name}",
                )
            _work_once(conn, Keel(conn), record, rng, name, config, lease)
        except psycopg.OperationalError:
            conn = None  # the backend was terminated: reconnect and carry on
            time.sleep(0.01)


def _work_once(
    conn: psycopg.Connection,
    keel: Keel,
    record: _Recorder,
    rng: random.Random,
    name: str,
    config: RaceConfig,
    lease: timedelta,
) -> None:
    task = _call(conn, record, "claim", lambda: keel.claim_next_task(name, lease, config.workflow))
    if task is None:
        time.sleep(0.005)
        return
    tid, token = str(task.task_id), task.fencing_token
    record(
        type="ok",
        op="claim",
        task=tid,
        token=token,
        acquired=task.lease_acquired_at,
        expires=task.lease_expires_at,
    )
    key = f"effect:{tid}"
    reservation = _call(
        conn,
        record,
        "reserve",
        lambda: keel.reserve_operation(
            task.tenant_id, task.task_id, key, "effect", "h", fencing_token=token
        ),
        task=tid,
        token=token,
    )
    if reservation is None:
        return
    record(type="ok", op="reserve", task=tid, token=token, outcome=reservation.outcome)
    if reservation.outcome == "reserved":
        record(type="effect", op="effect", key=key, task=tid, token=token)
    time.sleep(
        rng.uniform(0, 1.6) * lease.total_seconds()
    )  # the external call; may outlive the lease
    if reservation.outcome in ("reserved", "in_progress"):
        op = _call(
            conn,
            record,
            "complete",
            lambda: keel.complete_operation(
                task.tenant_id, reservation.operation_id, token, {"by": name}
            ),
            task=tid,
            token=token,
        )
        if op is None:
            return
        record(type="ok", op="complete", task=tid, token=token, at=op.updated_at, key=key)
    version = task.state_version
    for to_state in ("running", "done")[(0 if task.state == "queued" else 1) :]:
        message = f"{tid}:{version + 1}"
        moved = _call(
            conn,
            record,
            "transition",
            lambda s=to_state, v=version, m=message: keel.transition_task(
                task.tenant_id,
                task.task_id,
                v,
                s,
                fencing_token=token,
                outbox=[{"topic": "race", "payload": {"message": m}}],
            ),
            task=tid,
            token=token,
            message=message,
        )
        if moved is None:
            return
        record(
            type="ok",
            op="transition",
            task=tid,
            token=token,
            version=moved.state_version,
            at=moved.updated_at,
            message=message,
            terminal=to_state == "done",
        )
        version = moved.state_version


def _chaos(config: RaceConfig, stop: threading.Event) -> None:
    """Terminate a random worker backend now and then: outcomes become ambiguous."""
    rng = random.Random(7)
    with suite_connect(config.dsn, autocommit=True, options=config.options) as conn:
        while not stop.wait(rng.uniform(0.2, 0.5)):
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity"
                " where application_name like %s and pid <> pg_backend_pid()"
                " order by random() limit 1",
                (f"{APPLICATION_NAME}-%",),
            )


def run_race(
    config: RaceConfig, out_dir: Path, during: Callable[[], None] | None = None
) -> tuple[Verdict, list[dict[str, Any]]]:
    """Create the tasks, race the workers (running `during` alongside, e.g. a server crash),
    resolve ambiguous outcomes, check the history."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with suite_connect(config.dsn, autocommit=True, options=config.options) as conn:
        keel = Keel(conn)
        for _ in range(config.tasks):
            keel.create_task(config.tenant, config.workflow, 1)
        row = conn.execute("select pg_postmaster_start_time()").fetchone()
        server_started = row[0] if row else None
    ctx = multiprocessing.get_context("spawn")
    paths = [out_dir / f"history-w{i}.jsonl" for i in range(config.workers)]
    for p in paths:
        p.write_text("")
    procs = [
        ctx.Process(target=_worker, args=(config, i, str(paths[i]), 1000 + i), daemon=True)
        for i in range(config.workers)
    ]
    stop = threading.Event()
    chaos = threading.Thread(target=_chaos, args=(config, stop), daemon=True)
    for proc in procs:
        proc.start()
    if config.chaos:
        chaos.start()
    if during is not None:
        during()
    for proc in procs:
        proc.join(config.seconds + 60)
    stop.set()
    if config.chaos:
        chaos.join(10)
    # A worker that died (or hangs) left a truncated history that may still check clean:
    # its exit is a violation of its own.
    crashed = []
    for i, proc in enumerate(procs):
        if proc.exitcode is None:
            proc.kill()
            proc.join(10)
            crashed.append(f"worker w{i} did not finish: killed; its history is incomplete")
        elif proc.exitcode != 0:
            crashed.append(
                f"worker w{i} exited with code {proc.exitcode}: its history is incomplete"
            )
    events = load(paths)
    final = _final_state(config, events, server_started)
    verdict = check(events, final)
    verdict.violations.extend(crashed)
    return verdict, events


def _reused_from(conn: psycopg.Connection, server_started: Any) -> int | None:
    """After a crash, the first transaction id the restarted server may hand out again.

    An id whose transaction wrote nothing durable before the crash is given to a new
    transaction after it, and pg_xact_status() then reports the newcomer's outcome. The
    end-of-recovery checkpoint records where the restarted server's ids begin: every id
    from there on that was invoked before the crash never committed (the crash tier runs
    without the chaos thread, so every ambiguous call is one the crash cut short). None
    when the server did not restart during the run."""
    row = conn.execute("select pg_postmaster_start_time()").fetchone()
    if row is None or row[0] == server_started:
        return None
    try:
        checkpoint = conn.execute("select next_xid from pg_control_checkpoint()").fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return None  # only a superuser reads the control file; the crash tier has one
    if checkpoint is None:
        return None
    epoch, xid = (int(part) for part in str(checkpoint[0]).split(":"))
    return (epoch << 32) | xid


def _final_state(
    config: RaceConfig, events: list[dict[str, Any]], server_started: Any
) -> dict[str, Any]:
    with suite_connect(config.dsn, autocommit=True, options=config.options) as conn:
        reused_from = _reused_from(conn, server_started)
        for e in events:
            if e["type"] == "info" and e.get("xid"):
                if reused_from is not None and int(e["xid"]) >= reused_from:
                    e["xact"] = "aborted"  # lost in the crash; its id was handed out again
                    continue
                row = conn.execute("select pg_xact_status(%s::xid8)", (e["xid"],)).fetchone()
                e["xact"] = row[0] if row else None
        with in_tenant(conn, config.tenant):
            rows = conn.execute(
                "select task_id::text, seq, state_version from keel.task_events"
                " where tenant_id = %s order by task_id, seq",
                (config.tenant,),
            ).fetchall()
            outbox = conn.execute(
                "select payload ->> 'message', count(*) from keel.outbox"
                " where tenant_id = %s group by 1",
                (config.tenant,),
            ).fetchall()
            operations = conn.execute(
                "select idempotency_key, state from keel.operations where tenant_id = %s",
                (config.tenant,),
            ).fetchall()
    by_task: dict[str, list[tuple[int, int]]] = {}
    for task, seq, version in rows:
        by_task.setdefault(task, []).append((seq, version))
    return {"events": by_task, "outbox": dict(outbox), "operations": dict(operations)}
