"""The outcomes most runs end with (the handler returned a state), written in batches: one
keel.transition_tasks call per tenant for every run that finished meanwhile, as River's
batch completer does. Each item keeps the single call's guarantees (version, edge, fencing:
the batch function checks each item); the run's thread waits for its own item.

An item the batch could not decide for itself (the call failed as a whole, or the item's
refusal is not one of agentkeel's, such as a lock timeout) is written again as the single
keel.transition_task call, so it gets exactly the single call's outcome or error."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import psycopg

from agentkeel.client import Keel
from agentkeel.client.rows import Task, TransitionOutcome
from agentkeel.errors import KeelError, LeaseLost
from agentkeel.logs import log
from agentkeel.worker.lease import Lease
from agentkeel.worker.outcomes import Cancelled


@dataclass
class _Item:
    lease: Lease
    task: Task
    to_state: str
    done: threading.Event = field(default_factory=threading.Event)
    outcome: TransitionOutcome | None = None
    error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()


class Completer:
    """A thread writing queued "move to this state" outcomes, a batch per tenant of at
    most ``batch`` items (settings.max_batch_items or fewer)."""

    def __init__(
        self,
        keel_of: Callable[[], AbstractContextManager[Keel]],
        logger: logging.Logger,
        batch: int = 500,
    ) -> None:
        self._keel_of = keel_of
        self._logger = logger
        self._batch = max(1, batch)
        self._queue: list[_Item] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="completer", daemon=True)
        self._thread.start()

    def complete(self, lease: Lease, task: Task, to_state: str) -> TransitionOutcome:
        """Move the task to to_state, fenced by the lease, releasing it; raises Cancelled
        (nothing sent: the lease was lost or is past its deadline), LeaseLost (the database
        refused the token) or what the single call would have raised."""
        item = _Item(lease, task, to_state)
        with self._wake:
            if self._closed:
                raise RuntimeError("the completer is closed")
            self._queue.append(item)
            self._wake.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.outcome is not None
        return item.outcome

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                taken, self._queue = self._queue, []
            by_tenant: dict[uuid.UUID, list[_Item]] = {}
            for item in taken:
                by_tenant.setdefault(item.task.tenant_id, []).append(item)
            busy: list[_Item] = []
            for tenant, items in by_tenant.items():
                for start in range(0, len(items), self._batch):
                    chunk = items[start : start + self._batch]
                    try:
                        busy += self._write(tenant, chunk)
                    except BaseException as e:  # no connection: each run hears it
                        for item in chunk:
                            if not item.done.is_set():
                                item.finish(e)
            if busy:  # a lease's lock was held (a renewal): the next round takes them
                with self._wake:
                    self._queue[:0] = busy
                time.sleep(0.001)

    def _write(self, tenant: uuid.UUID, items: list[_Item]) -> list[_Item]:
        """Write one tenant's items; returns those whose lease's lock was busy."""
        with self._keel_of() as keel:  # the connection first, then the leases' locks
            held: list[_Item] = []
            busy: list[_Item] = []
            try:
                for item in items:
                    if item.lease.lock.acquire(blocking=False):
                        held.append(item)
                    else:
                        busy.append(item)
                sending: list[_Item] = []
                for item in held:  # checked once every lock is held, right before sending
                    try:
                        item.lease.check()
                    except Cancelled as e:
                        item.finish(e)
                        continue
                    sending.append(item)
                if sending:
                    self._send(keel, tenant, sending)
            finally:
                for item in held:
                    item.lease.lock.release()
            return busy

    def _send(self, keel: Keel, tenant: uuid.UUID, items: list[_Item]) -> None:
        try:
            outcomes = keel.transition_tasks(tenant, [_args(i) for i in items])
        except (KeelError, psycopg.Error) as e:
            if isinstance(e, psycopg.OperationalError) and keel.conn.broken:
                raise
            # Refused as a whole (a batch limit, a value the call cannot take): each item
            # gets the single call's answer instead.
            _log_refused(self._logger, e)
            for item in items:
                self._send_one(keel, tenant, item)
            return
        for item, outcome in zip(items, outcomes, strict=True):
            if outcome.refused is None:
                item.outcome = outcome
                item.lease.ended = True
                item.finish()
            elif outcome.refused.error is None:  # not agentkeel's: the single call says it
                self._send_one(keel, tenant, item)
            else:
                error = outcome.refused.error
                if isinstance(error, LeaseLost):
                    item.lease.cancel(f"the database refused the lease: {error.message}")
                item.finish(error)

    def _send_one(self, keel: Keel, tenant: uuid.UUID, item: _Item) -> None:
        try:
            item.lease.check()  # the batch before it may have taken a while
        except Cancelled as e:
            item.finish(e)
            return
        try:
            task = keel.transition_task(
                tenant,
                item.task.task_id,
                item.task.state_version,
                item.to_state,
                fencing_token=item.lease.token,
                release_lease=True,
            )
        except BaseException as e:
            if isinstance(e, LeaseLost):
                item.lease.cancel(f"the database refused the lease: {e.message}")
            item.finish(e)
            return
        item.outcome = TransitionOutcome(
            0, task.task_id, task.state, task.state_version, task.fencing_token, None
        )
        item.lease.ended = True
        item.finish()


def _args(item: _Item) -> dict[str, object]:
    return {
        "task_id": item.task.task_id,
        "expected_version": item.task.state_version,
        "to_state": item.to_state,
        "fencing_token": item.lease.token,
        "release_lease": True,
    }


def _log_refused(logger: logging.Logger, error: BaseException) -> None:
    log(
        logger,
        logging.WARNING,
        "a batch of outcomes was refused as a whole; writing them one by one",
        error=f"{type(error).__name__}: {error}".splitlines()[0],
    )
