"""What a handler is given: its task, its fencing token, and the calls that keep the run
ledger's guarantees for it (steps reused by input hash, checkpoints, guarded transitions),
each refused before it is sent once the lease is lost."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from agentkeel.client import Keel
from agentkeel.client.rows import Checkpoint, Json, Task
from agentkeel.errors import LeaseLost
from agentkeel.worker.lease import Lease
from agentkeel.worker.outcomes import Cancelled, Fail, Snooze, StepFailed
from agentkeel.worker.tracing import mark, step_span

KeelOf = Callable[[], AbstractContextManager[Keel]]


def input_hash(value: Any) -> str:
    """The sha256 of a step's input as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def error_of(error: BaseException) -> dict[str, str]:
    """An exception as a step's or an event's error: its class and first 1000 characters,
    as text jsonb takes (no NUL, no lone surrogate), so a handler's message cannot make the
    write of its own outcome fail."""
    message = str(error)[:1000].replace("\x00", "\\u0000")
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": type(error).__name__, "message": message}


class Context:
    """One run of a handler on one claimed task.

    Every call here is fenced twice: the runtime refuses it (Cancelled) once the lease was
    lost, given back at shutdown, or is past its deadline, and the database refuses a stale
    token (lease_lost, turned into Cancelled). No call holds a transaction open while the
    handler's own code runs (G7).
    """

    def __init__(
        self,
        task: Task,
        attempt: int | Callable[[], int],
        lease: Lease,
        keel_of: KeelOf,
        stopping: threading.Event | None = None,
    ) -> None:
        self.task = task
        self._stopping = stopping or threading.Event()
        # 1 for the first run in this state, n after n - 1 retries; read from the history
        # when first asked (a handler that succeeds never pays for it).
        self._attempt = attempt if isinstance(attempt, int) else None
        self._attempt_of = attempt if callable(attempt) else (lambda: 1)
        self._lease = lease
        self._keel_of = keel_of
        self.moved = False  # the handler moved the task (transition)
        self.refused_writes = 0  # writes the database refused for a lost lease

    # -- what the handler reads --------------------------------------------------------
    @property
    def tenant_id(self) -> uuid.UUID:
        return self.task.tenant_id

    @property
    def task_id(self) -> uuid.UUID:
        return self.task.task_id

    @property
    def fencing_token(self) -> int:
        return self._lease.token

    @property
    def state(self) -> str:
        return self.task.state

    @property
    def metadata(self) -> Json:
        return self.task.metadata

    @property
    def trace_id(self) -> str | None:
        """The task's W3C trace id: its events carry it too."""
        return self.task.trace_id

    @property
    def span_id(self) -> str | None:
        return self.task.span_id

    @property
    def cancelled(self) -> bool:
        return self._lease.cancelled.is_set()

    @property
    def attempt(self) -> int:
        """1 on the first run in this state, n after n - 1 retries."""
        if self._attempt is None:
            self._attempt = self._attempt_of()
        return self._attempt

    @attempt.setter
    def attempt(self, value: int) -> None:
        self._attempt = value

    @property
    def stopping(self) -> bool:
        """The worker was told to stop: a good moment to end between steps (the task is
        due again for the next worker, its completed steps reused)."""
        return self._stopping.is_set()

    def check(self) -> None:
        """Raise Cancelled if the work must stop (call it in long loops)."""
        self._lease.check()

    def sleep(self, seconds: float) -> None:
        """Wait, but raise Cancelled at once when the task is cancelled meanwhile."""
        if self._lease.cancelled.wait(seconds):
            self._lease.check()
        self._lease.check()

    # -- fenced calls ------------------------------------------------------------------
    @contextmanager
    def keel(self) -> Iterator[Keel]:
        """A Keel client for one fenced call of your own (``reserve_operation``,
        ``complete_operation``, ...; pass ``ctx.fencing_token``), made only while the lease
        holds; the database's lease_lost becomes Cancelled."""
        self._lease.check()
        # The connection first: a wait for the pool never holds the lease's lock (the
        # heartbeat skips a lease whose lock is held), and the deadline is checked again
        # once the call can be sent at once.
        with self._keel_of() as keel, self._lease.lock:
            self._lease.check()
            try:
                yield keel
            except LeaseLost as e:
                self.refused_writes += 1
                self._lease.cancel(f"the database refused the lease: {e.message}")
                raise Cancelled(self._lease.reason or "lease lost") from e

    def transition(
        self,
        to_state: str,
        *,
        payload: Json = None,
        outbox: Sequence[Mapping[str, Any]] | None = None,
        event_type: str | None = None,
        current_step: str | None = None,
    ) -> Task:
        """Move the task along one legal edge (G3), with its event and outbox messages, and
        keep the lease unless the state is terminal."""
        with self.keel() as keel:
            before = self.task.state
            self.task = keel.transition_task(
                self.tenant_id,
                self.task_id,
                self.task.state_version,
                to_state,
                fencing_token=self.fencing_token,
                payload=payload,
                outbox=outbox,
                event_type=event_type,
                current_step=current_step,
            )
            self.moved = True
            if self.task.state != before:
                self.attempt = 1  # the first run in the new state
            if self.task.lease_owner is None:  # a terminal state ended the lease
                self._lease.ended = True
        return self.task

    def checkpoint(
        self,
        kind: str,
        payload: Json,
        *,
        step_key: str | None = None,
        ttl: timedelta | None = None,
    ) -> Checkpoint:
        """Save an encrypted checkpoint (the worker's key provider), fenced by the lease."""
        with self.keel() as keel:
            return keel.save_checkpoint(
                self.tenant_id,
                self.task_id,
                self.fencing_token,
                kind,
                payload,
                step_key=step_key,
                ttl=ttl,
            )

    def load_checkpoint(self, kind: str | None = None) -> Json:
        """The payload of the task's latest valid checkpoint, or None."""
        with self.keel() as keel:
            loaded = keel.load_latest_checkpoint(self.tenant_id, self.task_id, kind)
        return None if loaded is None else loaded.payload

    # -- durable steps (G8) ------------------------------------------------------------
    def step(self, key: str, input: Any, fn: Callable[[], Any]) -> Json:
        """Run ``fn`` as durable step ``key`` of this task, or reuse its stored result.

        A completed step with the same input (its sha256 as canonical JSON) is not run
        again: its result comes back and a STEP_RESULT_REUSED event is written. Otherwise
        the attempt is opened and committed, ``fn()`` runs with no transaction open, and
        its result (JSON) is stored. If ``fn`` raises, the attempt is stored as failed
        (retryable unless it raised Fail) and the exception goes on to the runtime."""
        with step_span(key) as span:
            done, value = self._begin(key, input)
            mark(span, done)
            if done:
                return value
            try:
                result = fn()
            except Exception as e:
                self._fail_step(key, e)
                raise
            return self._complete_step(key, result)

    async def step_async(self, key: str, input: Any, fn: Callable[[], Awaitable[Any]]) -> Json:
        """``step`` for an async handler: ``fn`` is an async function."""
        with step_span(key) as span:
            done, value = await asyncio.to_thread(self._begin, key, input)
            mark(span, done)
            if done:
                return value
            try:
                result = await fn()
            except Exception as e:
                await asyncio.to_thread(self._fail_step, key, e)
                raise
            return await asyncio.to_thread(self._complete_step, key, result)

    def _begin(self, key: str, input: Any) -> tuple[bool, Json]:
        with self.keel() as keel:
            start = keel.begin_step(
                self.tenant_id, self.task_id, key, input_hash(input), self.fencing_token
            )
        if start.outcome == "reused":
            return True, start.result
        if start.outcome in ("started", "in_progress"):  # in_progress: this lease's own
            return False, None
        if start.outcome == "retry_later":
            wait = (start.next_retry_at or datetime.now(UTC)) - datetime.now(UTC)
            raise Snooze(max(wait, timedelta(0)))
        raise StepFailed(key, start.error)

    def _complete_step(self, key: str, result: Any) -> Json:
        stored = json.loads(json.dumps(result))  # what a reuse would give back
        with self.keel() as keel:
            keel.complete_step(self.tenant_id, self.task_id, key, self.fencing_token, stored)
        return stored

    def _fail_step(self, key: str, error: Exception) -> None:
        if self._lease.cancelled.is_set():
            return  # nothing may be written; the next lease holder closes the attempt
        with self.keel() as keel:
            keel.fail_step(
                self.tenant_id,
                self.task_id,
                key,
                self.fencing_token,
                error_of(error),
                retryable=not isinstance(error, Fail),
            )
