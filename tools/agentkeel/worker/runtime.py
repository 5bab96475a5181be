"""The worker loop: claim due tasks in batches, run each with its handler in a thread of
its own, keep each lease alive on a heartbeat, write each outcome as a guarded transition,
and stop gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from agentkeel.checkpoints import KeyProvider
from agentkeel.client import Keel
from agentkeel.client.rows import Task
from agentkeel.errors import KeelError, LeaseLost
from agentkeel.logs import log
from agentkeel.pooler import is_pooled
from agentkeel.recover import fit_limit
from agentkeel.worker.attempts import (
    ERROR_EVENT,
    FAILED_EVENT,
    RETRY_EVENT,
    SNOOZE_EVENT,
    WINDOW,
    backoff,
    runs_so_far,
)
from agentkeel.worker.completer import Completer
from agentkeel.worker.context import Context, error_of
from agentkeel.worker.lease import Lease
from agentkeel.worker.outcomes import Cancelled, Fail, MoveTo, Retry, Snooze, StepFailed
from agentkeel.worker.registry import Handler, Registry
from agentkeel.worker.tracing import run_span

LOGGER = "agentkeel.worker"

# How long a task in a state no handler of this worker runs waits before it is offered
# again (to this worker or another).
UNHANDLED_DELAY = timedelta(seconds=30)


def default_name() -> str:
    return f"agentkeel-worker@{socket.gethostname()}:{os.getpid()}"[:200]


@dataclass
class Config:
    dsn: str
    concurrency: int = 4
    lease: timedelta = timedelta(seconds=30)
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    progress_interval: float = 10.0
    name: str = field(default_factory=default_name)
    workflows: tuple[str, ...] = ()  # only these of the registry's workflows; all if empty
    key_provider: KeyProvider | None = None
    detect_pooler: bool = True


@dataclass
class Stats:
    claimed: int = 0
    done: int = 0  # runs that moved their task on
    retried: int = 0
    snoozed: int = 0
    failed: int = 0  # tasks moved to their failed (or an error's) state
    lost: int = 0  # runs stopped by a lost lease
    released: int = 0  # leases given back at shutdown or for want of a handler
    errors: int = 0  # outcomes that could not be written (the lease is given back)
    refused_writes: int = 0  # writes the database refused for a lost lease

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class ConfigError(Exception):
    """The registry does not fit the database's workflows: the one line the CLI prints."""


class LoginRefused(Exception):
    """The login may not do a worker's calls: the one line the CLI prints."""


class Worker:
    """Runs a Registry's handlers on the tasks it claims; ``run()`` until ``stop()``."""

    def __init__(
        self, config: Config, registry: Registry, logger: logging.Logger | None = None
    ) -> None:
        self.config = config
        self.registry = registry
        self.logger = logger or logging.getLogger(LOGGER)
        self.stats = Stats()
        self._stats_lock = threading.Lock()
        self._leases: dict[Any, Lease] = {}
        self._running_lock = threading.Condition()
        self._busy = 0  # handlers running (their leases are in _leases until settled)
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # a second signal: give everything back now
        self._done = threading.Event()  # shut down: the heartbeat ends
        self._connect_kwargs: dict[str, Any] = {}
        self.pool: ConnectionPool | None = None
        self._completer: Completer | None = None
        self._batch_limit = 1000
        self._last_progress = (time.monotonic(), 0)  # when, and tasks settled by then
        names = config.workflows or tuple(registry.workflows)
        unknown = sorted(set(names) - set(registry.workflows))
        if unknown:
            raise ConfigError(f"no handler is registered for workflow {', '.join(unknown)}")
        if not names:
            raise ConfigError("the registry has no handler")
        self.workflows = list(names)

    # -- life cycle --------------------------------------------------------------------
    def stop(self) -> None:
        """The first call stops claiming and lets running handlers finish (up to
        shutdown_timeout); the second gives every held lease back at once."""
        if self._stopping.is_set():
            self._hurry.set()
            log(self.logger, logging.WARNING, "second signal: giving every lease back now")
        else:
            log(self.logger, logging.INFO, "stopping: no new claims", running=self._busy)
        self._stopping.set()
        with self._running_lock:
            self._running_lock.notify_all()

    def run(self) -> Stats:
        self.pool = self._open_pool()
        try:
            self._check_login()
            self._check_workflows()
            with self.keel() as keel:  # settings.max_batch_items bounds claims and batches
                self._batch_limit = fit_limit(keel.conn, 1000)
            self._completer = Completer(self.keel, self.logger, min(500, self._batch_limit))
            log(
                self.logger,
                logging.INFO,
                "worker started",
                worker=self.config.name,
                workflows=self.workflows,
                concurrency=self.config.concurrency,
                lease_seconds=self.config.lease.total_seconds(),
            )
            heartbeat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
            heartbeat.start()
            self._claim_loop()
        finally:
            # Also after an unexpected error: what runs may finish, what is held goes back.
            self._stopping.set()
            try:
                self._shut_down()
            finally:
                if self._completer is not None:
                    self._completer.close()
                self._done.set()
                self.pool.close()
        log(self.logger, logging.INFO, "worker stopped", **self.stats.as_dict())
        return self.stats

    def _open_pool(self) -> ConnectionPool:
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": "agentkeel-worker"}
        if self.config.detect_pooler:
            with psycopg.connect(self.config.dsn, **kwargs) as conn:
                if is_pooled(conn):
                    kwargs["prepare_threshold"] = None
        self._connect_kwargs = kwargs
        # A connection for each run that may be calling the database (its handler's, or
        # its outcome's once the handler returned: 2 x concurrency), one for the claims and
        # one for the batch completer (the heartbeat has its own).
        return ConnectionPool(
            self.config.dsn,
            min_size=1,
            max_size=2 * self.config.concurrency + 2,
            kwargs=kwargs,
            open=True,
            name="agentkeel-worker",
        )

    @contextmanager
    def keel(self, timeout: float | None = None) -> Iterator[Keel]:
        """A client on a pooled connection (waiting for one up to timeout, else the
        pool's 30 seconds)."""
        assert self.pool is not None
        with self.pool.connection(timeout=timeout) as conn:
            yield Keel(conn, key_provider=self.config.key_provider, detect_pooler=False)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def _check_login(self) -> None:
        """Refuse a login that cannot claim or renew (not in keel_worker); warn about the
        owner, which bypasses what the worker's role is limited to."""
        assert self.pool is not None
        with self.pool.connection() as conn:
            row = conn.execute(
                "select pg_catalog.has_function_privilege("
                "   'keel.claim_next_tasks(text, integer, interval, text)', 'execute')"
                " and pg_catalog.has_function_privilege("
                "   'keel.renew_lease(uuid, uuid, bigint, interval)', 'execute'),"
                " pg_catalog.pg_has_role('keel_owner', 'member')"
            ).fetchone()
        assert row is not None
        if not row[0]:
            raise LoginRefused(
                f"{conn.info.user} may not claim tasks or renew leases: "
                "the worker needs a login in keel_worker"
            )
        if row[1]:
            log(
                self.logger,
                logging.WARNING,
                "running as a member of keel_owner: give the worker a login in keel_worker",
                login=conn.info.user,
            )

    def _check_workflows(self) -> None:
        """Refuse to start when a state a handler's outcome may be written from lacks the
        edge it writes: a self-edge for a retry or snooze, an edge to the failed state. A
        handler may move its task on before it fails, so every state reachable from a
        handled one is checked (with that handler's policy)."""
        missing: list[str] = []
        assert self.pool is not None
        with self.pool.connection() as conn:
            for name in self.workflows:
                rows = conn.execute(
                    "select s.workflow_version, s.state, s.terminal,"
                    " array(select t.to_state from keel.workflow_transitions as t"
                    "  where t.workflow = s.workflow and t.workflow_version = s.workflow_version"
                    "   and t.from_state = s.state order by t.to_state)"
                    " from keel.workflow_states as s where s.workflow = %s"
                    " order by s.workflow_version, s.state",
                    (name,),
                ).fetchall()
                if not rows:
                    raise ConfigError(f"workflow {name} is not defined in this database")
                versions: dict[int, dict[str, tuple[bool, list[str]]]] = {}
                for version, state, terminal, targets in rows:
                    versions.setdefault(version, {})[state] = (terminal, list(targets))
                newest = max(versions)
                for version, states in versions.items():
                    edges = missing_edges(self.registry, name, states)
                    if not edges:
                        continue
                    if version == newest:
                        missing.append(f"{name} v{version} needs {', '.join(edges)}")
                    else:  # immutable: a task of it that fails waits for the recoverer
                        log(
                            self.logger,
                            logging.WARNING,
                            "an older workflow version lacks edges the worker writes: its "
                            "tasks' retries and failures will be refused, their leases "
                            "expire and the recoverer fails them",
                            workflow=name,
                            version=version,
                            needs=", ".join(edges),
                        )
        if missing:
            raise ConfigError(
                f"{'; '.join(missing)}: the worker writes a self-edge for a retry or snooze "
                "and an edge to the handler's failed state (define a new workflow version)"
            )

    # -- claiming ------------------------------------------------------------------------
    def _claim_loop(self) -> None:
        turn = 0
        while not self._stopping.is_set():
            with self._running_lock:
                while self._free() <= 0 and not self._stopping.is_set():
                    self._running_lock.wait(self.config.poll_interval)
                    self._progress()
                free = self._free()
            if self._stopping.is_set():
                break
            claimed = 0
            try:
                for i in range(len(self.workflows)):
                    workflow = self.workflows[(turn + i) % len(self.workflows)]
                    got = self._claim(workflow, free - claimed)
                    claimed += got
                    if claimed >= free:
                        break
                turn += 1
            except (psycopg.Error, KeelError) as e:
                log(
                    self.logger,
                    logging.WARNING,
                    "claim failed; trying again",
                    error=f"{type(e).__name__}: {e}".strip(),
                )
                with contextlib.suppress(psycopg.Error), self.keel() as keel:
                    self._batch_limit = fit_limit(keel.conn, self._batch_limit)
                self._stopping.wait(self.config.poll_interval)
                continue
            self._progress()
            if claimed == 0:
                self._stopping.wait(self.config.poll_interval)

    def _claim(self, workflow: str, limit: int) -> int:
        sent = time.monotonic()
        limit = min(limit, self._batch_limit)
        with self.keel() as keel:
            tasks = keel.claim_next_tasks(self.config.name, limit, self.config.lease, workflow)
        self._count(claimed=len(tasks))
        for task in tasks:
            lease = Lease(task.tenant_id, task.task_id, task.fencing_token, self.config.lease, sent)
            key = (task.tenant_id, task.task_id)
            thread = threading.Thread(
                target=self._run_task, args=(task, lease), daemon=True, name=f"task-{task.task_id}"
            )
            with self._running_lock:
                self._leases[key] = lease
                self._busy += 1
            thread.start()
        return len(tasks)

    def _free(self) -> int:
        """Handlers that may start now: concurrency less the running ones. A run whose
        handler returned frees its slot while its outcome is written, but no more than
        concurrency leases wait on their outcomes at once. Under _running_lock."""
        return min(
            self.config.concurrency - self._busy, 2 * self.config.concurrency - len(self._leases)
        )

    def _progress(self) -> None:
        """The progress line, once per progress_interval: the counts, and tasks settled
        per second since the last line."""
        now = time.monotonic()
        if now - self._last_progress[0] < self.config.progress_interval:
            return
        counts = self.stats.as_dict()
        settled = sum(counts[k] for k in ("done", "retried", "snoozed", "failed"))
        seconds = max(now - self._last_progress[0], 1e-9)
        per_second = round((settled - self._last_progress[1]) / seconds, 1)
        self._last_progress = (now, settled)
        log(
            self.logger,
            logging.INFO,
            "progress",
            running=self._busy,
            per_second=per_second,
            **counts,
        )

    # -- one task ------------------------------------------------------------------------
    def _run_task(self, task: Task, lease: Lease) -> None:
        key = (task.tenant_id, task.task_id)
        freed = False

        def free_slot() -> None:
            nonlocal freed
            if not freed:
                freed = True
                with self._running_lock:
                    self._busy -= 1
                    self._running_lock.notify_all()

        try:
            handler = self.registry.find(task.workflow, task.state)
            if handler is None:
                self._release(lease, "no handler for this state", UNHANDLED_DELAY)
                log(
                    self.logger,
                    logging.WARNING,
                    "no handler for the task's state; released",
                    task_id=str(task.task_id),
                    workflow=task.workflow,
                    state=task.state,
                )
                return
            self._run_handler(task, lease, handler, free_slot)
        except BaseException as e:  # nothing could be written: the lease is given back
            self._count(errors=1)
            log(
                self.logger,
                logging.ERROR,
                "task outcome not written; its lease is given back",
                task_id=str(task.task_id),
                error=f"{type(e).__name__}: {e}",
            )
            self._release_quietly(lease, "its outcome could not be written")
        finally:
            free_slot()
            with self._running_lock:
                if self._leases.get(key) is lease:  # not a later claim of the same task
                    self._leases.pop(key, None)
                self._running_lock.notify_all()

    def _attempt(self, task: Task) -> int:
        """1 + the retries of this state so far, from the task's latest events."""
        with self.keel() as keel:
            after = task.last_event_seq
            while after > 0:
                after = max(after - WINDOW, 0)
                events = keel.task_history(
                    task.tenant_id, task.task_id, after_seq=after, limit=WINDOW
                )
                runs = runs_so_far(events)
                if runs is not None:
                    return runs + 1
        return 1

    def _run_handler(
        self, task: Task, lease: Lease, handler: Handler, free_slot: Callable[[], None]
    ) -> None:
        ctx = Context(task, lambda: self._attempt(task), lease, self.keel, self._stopping)
        started = time.monotonic()
        log(
            self.logger,
            logging.DEBUG,
            "task started",
            task_id=str(task.task_id),
            tenant_id=str(task.tenant_id),
            state=task.state,
            trace_id=task.trace_id,
        )
        outcome: BaseException | None = None
        result: Any = None
        try:
            with run_span(task):
                if inspect.iscoroutinefunction(handler.fn):
                    result = asyncio.run(self._run_async(handler, ctx, lease))
                else:
                    result = handler.fn(ctx)
        except (Cancelled, asyncio.CancelledError) as e:
            if lease.cancelled.is_set():
                outcome = Cancelled(lease.reason or "cancelled")
            else:  # the handler's own cancellation, not its lease's: an error like any
                outcome = RuntimeError(f"the handler raised {type(e).__name__}: {e}")
        except BaseException as e:  # SystemExit from a handler's own code counts as well
            outcome = e
        free_slot()  # the handler is done: another may start while its outcome is written
        self._count(refused_writes=ctx.refused_writes)
        fields = {
            "task_id": str(task.task_id),
            "tenant_id": str(task.tenant_id),
            "state": task.state,
            "seconds": round(time.monotonic() - started, 3),
        }
        if isinstance(outcome, Cancelled) or lease.cancelled.is_set():
            if not lease.released:  # given back at shutdown: counted as released
                self._count(lost=1)
            reason = lease.reason or (outcome.reason if isinstance(outcome, Cancelled) else "")
            log(
                self.logger,
                logging.WARNING,
                "task stopped: nothing more written for it",
                reason=reason,
                **fields,
            )
            return
        try:
            try:
                self._settle(ctx, handler, result, outcome, fields)
            except KeelError as refused:
                if isinstance(refused, LeaseLost):
                    raise
                # The outcome the handler chose is refused (its payload, its edge, its
                # wake time): the task fails instead, with the refusal as its error.
                log(
                    self.logger,
                    logging.ERROR,
                    "the database refused the outcome; failing the task instead",
                    refusal=error_of(refused),
                    **fields,
                )
                instead = Fail(f"the outcome was refused: {refused.message} [{refused.sqlstate}]")
                self._settle(ctx, handler, None, instead, fields)
        except Cancelled as e:
            if not lease.released:
                self._count(lost=1)
            log(
                self.logger,
                logging.WARNING,
                "task stopped before its outcome was written",
                reason=e.reason,
                **fields,
            )
        except LeaseLost as e:
            self._count(lost=1, refused_writes=1)
            log(
                self.logger,
                logging.WARNING,
                "the database refused the lease",
                reason=e.message,
                **fields,
            )

    async def _run_async(self, handler: Handler, ctx: Context, lease: Lease) -> Any:
        """An async handler in an event loop of its own, cancelled (CancelledError at its
        next await) the moment the lease is lost."""
        loop = asyncio.get_running_loop()
        job = asyncio.ensure_future(handler.fn(ctx))

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(job.cancel)

        lease.on_cancel(cancel)
        try:
            return await job
        finally:
            lease.forget(cancel)

    def _settle(
        self,
        ctx: Context,
        handler: Handler,
        result: Any,
        error: BaseException | None,
        fields: dict[str, Any],
    ) -> None:
        """Write the run's outcome: a returned state through the batch completer, anything
        else as one guarded call under the lease's lock."""
        lease = ctx._lease
        if error is None and ctx.moved and lease.ended:
            # The handler's own transition ended the lease (a terminal state): that was
            # the outcome; a state it also returned is not written again.
            self._count(done=1)
            log(self.logger, logging.INFO, "task moved", to_state=ctx.task.state, **fields)
            return
        if error is None and isinstance(result, str):
            assert self._completer is not None
            moved = self._completer.complete(lease, ctx.task, result)
            self._count(done=1)
            log(self.logger, logging.INFO, "task moved", to_state=moved.state, **fields)
            return
        if error is not None or not ctx.moved:
            ctx.attempt  # noqa: B018 - read from the history now, not under the lock below
        # The connection first, then the lease's lock, and the lease checked once both are
        # held: a wait for the pool never holds the lock, nor is sent past the deadline.
        with self.keel() as keel, lease.lock:
            lease.check()
            self._write_outcome(ctx, handler, keel, result, error, fields)

    def _write_outcome(
        self,
        ctx: Context,
        handler: Handler,
        keel: Keel,
        result: Any,
        error: BaseException | None,
        fields: dict[str, Any],
    ) -> None:
        """One guarded transition with its event, or the lease given back."""
        lease = ctx._lease

        def move(to_state: str, **kwargs: Any) -> Task:
            return keel.transition_task(
                ctx.tenant_id,
                ctx.task_id,
                ctx.task.state_version,
                to_state,
                fencing_token=lease.token,
                **kwargs,
            )

        if error is None and ctx.moved:
            if ctx.task.lease_owner is not None:
                keel.release_lease(ctx.tenant_id, ctx.task_id, lease.token)
            self._count(done=1)
            log(self.logger, logging.INFO, "task moved", to_state=ctx.task.state, **fields)
        elif isinstance(error, Snooze):
            move(
                ctx.state,
                event_type=SNOOZE_EVENT,
                release_lease=True,
                payload={"seconds": error.delay.total_seconds()},
                wake_at=datetime.now(UTC) + error.delay,
            )
            self._count(snoozed=1)
            log(
                self.logger,
                logging.INFO,
                "task snoozed",
                delay_seconds=error.delay.total_seconds(),
                **fields,
            )
        elif isinstance(error, MoveTo):
            move(error.state, payload=error.payload, release_lease=True)
            self._count(done=1)
            log(self.logger, logging.INFO, "task moved", to_state=error.state, **fields)
        else:
            if error is None:
                error = RuntimeError(
                    "the handler returned without moving the task (return a state, call "
                    "ctx.transition, or raise)"
                )
            failure = decide(ctx, handler, error)
            move(
                failure.to_state,
                event_type=failure.event,
                release_lease=True,
                payload=failure.payload,
                wake_at=failure.wake_at,
            )
            self._count(**{failure.counter: 1})
            log(
                self.logger,
                failure.level,
                failure.message,
                attempt=ctx.attempt,
                to_state=failure.to_state,
                error=error_of(error),
                traceback=trace_of(error),
                **failure.fields,
                **fields,
            )
        lease.ended = True

    def _release_quietly(self, lease: Lease, reason: str) -> None:
        try:
            self._release(lease, reason)
        except Exception as e:  # the lease then expires
            log(
                self.logger,
                logging.ERROR,
                "lease not given back; it will expire",
                task_id=str(lease.task_id),
                error=f"{type(e).__name__}: {e}",
            )

    def _release(self, lease: Lease, reason: str, wait: timedelta | None = None) -> bool:
        """Give a held lease back (due again now, or after wait); False if it was not held
        (ended, or past its deadline: then it is not sent, the lease expires on its own)."""
        # The connection first, then the lock; at shutdown a pool that stays dry (the
        # database gone) does not hold the exit up for long: the lease then expires.
        with self.keel(timeout=5.0) as keel, lease.lock:
            if lease.ended or lease.expired():
                lease.cancel(reason)
                return False
            lease.ended = True
            lease.released = True  # before the cancel a handler may wake to
            lease.cancel(reason)
            try:
                keel.release_lease(
                    lease.tenant_id,
                    lease.task_id,
                    lease.token,
                    wake_at=datetime.now(UTC) + wait if wait else None,
                )
            except LeaseLost:
                return False
            self._count(released=1)
            return True

    # -- heartbeat -----------------------------------------------------------------------
    def _heartbeat(self) -> None:
        """Renew every held lease each third of its length; a refused renewal cancels the
        handler's work, and so does a lease whose deadline passed without a renewal. On a
        connection of its own, so handlers that hold every pooled one cannot starve it."""
        every = self.config.lease.total_seconds() / 3
        conn: psycopg.Connection | None = None
        try:
            while not self._done.wait(every):
                with self._running_lock:
                    leases = list(self._leases.values())
                for lease in leases:
                    conn = self._renew(lease, conn)
        finally:
            if conn is not None:
                conn.close()

    def _renew(self, lease: Lease, conn: psycopg.Connection | None) -> psycopg.Connection | None:
        """Renew one lease; the heartbeat's connection (made again when it broke). A lease
        whose lock a write holds is skipped this round, so one slow call never holds up
        the other leases' renewals."""
        if not lease.lock.acquire(blocking=False):
            return conn
        with contextlib.ExitStack() as held:
            held.callback(lease.lock.release)
            if lease.ended or lease.cancelled.is_set():
                return conn
            if lease.expired():
                lease.cancel("lease expired before it could be renewed")
                return conn
            sent = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.config.dsn, **self._connect_kwargs)
                Keel(conn, detect_pooler=False).renew_lease(
                    lease.tenant_id, lease.task_id, lease.token, self.config.lease
                )
                lease.renewed(sent)
            except LeaseLost as e:
                lease.cancel(f"the lease was taken over: {e.message}")
            except Exception as e:  # the heartbeat goes on: the deadline guards the lease
                if conn is not None and (not isinstance(e, psycopg.Error) or conn.broken):
                    conn.close()
                log(
                    self.logger,
                    logging.WARNING,
                    "lease renewal failed; trying again",
                    task_id=str(lease.task_id),
                    error=f"{type(e).__name__}: {e}",
                )
            return conn

    # -- shutdown ------------------------------------------------------------------------
    def _shut_down(self) -> None:
        """Let running handlers finish up to shutdown_timeout (or a second signal), then
        give back every lease still held: its task is due again at once, for any worker."""
        deadline = time.monotonic() + self.config.shutdown_timeout
        with self._running_lock:
            while self._leases and not self._hurry.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._running_lock.wait(min(left, 0.2))
            leases = list(self._leases.values())
        for lease in leases:
            try:
                released = self._release(lease, "the worker is shutting down")
            except Exception as e:  # the database is gone: the lease expires
                log(
                    self.logger,
                    logging.ERROR,
                    "lease not given back at shutdown; it will expire",
                    task_id=str(lease.task_id),
                    error=f"{type(e).__name__}: {e}",
                )
                continue
            if released:
                log(
                    self.logger,
                    logging.WARNING,
                    "lease given back at shutdown",
                    task_id=str(lease.task_id),
                    tenant_id=str(lease.tenant_id),
                )


@dataclass(frozen=True)
class Failure:
    """What a handler's exception is written as: a retry, its failed state, or the state
    its class maps to."""

    to_state: str
    event: str
    payload: dict[str, Any]
    counter: str  # the Stats field it adds to
    message: str  # the log line
    level: int
    wake_at: datetime | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def decide(ctx: Context, handler: Handler, error: BaseException) -> Failure:
    """The outcome of a run that raised (or returned without moving its task)."""
    mapped = next((s for cls, s in handler.errors.items() if isinstance(error, cls)), None)
    if mapped is not None:
        payload = {"attempt": ctx.attempt, "error": error_of(error)}
        return Failure(mapped, ERROR_EVENT, payload, "failed", "task error", logging.WARNING)
    if isinstance(error, Fail | StepFailed) or ctx.attempt >= handler.max_attempts:
        payload = {"attempts": ctx.attempt, "error": error_of(error)}
        return Failure(
            handler.failed_state, FAILED_EVENT, payload, "failed", "task failed", logging.WARNING
        )
    delay = (
        error.delay
        if isinstance(error, Retry) and error.delay is not None
        else backoff(ctx.attempt, handler.backoff_base, handler.backoff_cap)
    )
    seconds = round(delay.total_seconds(), 3)
    payload = {"attempt": ctx.attempt, "error": error_of(error), "retry_in_seconds": seconds}
    return Failure(
        ctx.state,
        RETRY_EVENT,
        payload,
        "retried",
        "task retried",
        logging.INFO,
        wake_at=datetime.now(UTC) + delay,
        fields={"retry_in_seconds": seconds},
    )


def trace_of(error: BaseException) -> str:
    """The handler's traceback, for the log (never stored: events get error_of)."""
    return "".join(traceback.format_exception(error)).rstrip()


def missing_edges(
    registry: Registry, workflow: str, states: dict[str, tuple[bool, list[str]]]
) -> list[str]:
    """The edges ``from -> to`` a worker may write in one version of a workflow (its states:
    terminal, targets) that it does not have, in order: from every non-terminal state a
    handler may leave its task in, a self-edge, and edges to its failed state and to the
    states its ``errors`` map to."""
    missing: list[str] = []
    for state in sorted(states):
        handler = registry.find(workflow, state)
        if handler is None or states[state][0]:
            continue
        seen, frontier = {state}, [state]
        while frontier:  # the non-terminal states the handler may leave its task in
            for target in states[frontier.pop()][1]:
                if target in states and target not in seen and not states[target][0]:
                    seen.add(target)
                    frontier.append(target)
        for at in sorted(seen):
            # A retry or snooze (a step's retry_later snoozes too) is a self-edge.
            needs = [handler.failed_state, at, *handler.errors.values()]
            for target in needs:
                edge = f"{at} -> {target}"
                if target not in states[at][1] and edge not in missing:
                    missing.append(edge)
    return missing


def run_worker(
    config: Config,
    registry: Registry,
    logger: logging.Logger | None = None,
    install_signals: bool = True,
) -> Stats:
    """Run until SIGTERM or SIGINT (a second one hurries the shutdown)."""
    import signal

    worker = Worker(config, registry, logger)
    if install_signals:
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for signum in previous:
            signal.signal(signum, lambda *_: worker.stop())
    try:
        return worker.run()
    finally:
        if install_signals:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
