"""The outcomes most runs end with (the handler returned a state), written in batches: one
keel.transition_tasks call per tenant for every run that finished meanwhile, as River's
batch completer does. Each item keeps the single call's guarantees (version, edge, fencing:
the batch function checks each item); the run's thread waits for its own item."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from agentkeel.client import Keel
from agentkeel.client.rows import Task, TransitionOutcome
from agentkeel.errors import KeelError, LeaseLost
from agentkeel.worker.lease import Lease
from agentkeel.worker.outcomes import Cancelled

# Items per transition_tasks call (at most settings.max_batch_items, 1000 by default).
BATCH = 500


@dataclass
class _Item:
    lease: Lease
    task: Task
    to_state: str
    done: threading.Event = field(default_factory=threading.Event)
    outcome: TransitionOutcome | None = None
    error: BaseException | None = None


class Completer:
    """A thread writing queued "move to this state" outcomes, a batch per tenant."""

    def __init__(
        self, keel_of: Callable[[], AbstractContextManager[Keel]], logger: logging.Logger
    ) -> None:
        self._keel_of = keel_of
        self._logger = logger
        self._queue: list[_Item] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="completer", daemon=True)
        self._thread.start()

    def complete(self, lease: Lease, task: Task, to_state: str) -> TransitionOutcome:
        """Move the task to to_state, fenced by the lease, releasing it; raises Cancelled
        (nothing sent: the lease was lost or is past its deadline), LeaseLost (the database
        refused the token) or the KeelError the single call would have raised."""
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
                taken, self._queue = self._queue[:BATCH], self._queue[BATCH:]
            by_tenant: dict[uuid.UUID, list[_Item]] = {}
            for item in taken:
                by_tenant.setdefault(item.task.tenant_id, []).append(item)
            for tenant, items in by_tenant.items():
                try:
                    self._write(tenant, items)
                except BaseException as e:  # the call failed as a whole: each run hears it
                    for item in items:
                        if not item.done.is_set():
                            item.error = e
                finally:
                    for item in items:
                        item.done.set()

    def _write(self, tenant: uuid.UUID, items: list[_Item]) -> None:
        with self._keel_of() as keel:  # the connection first, then the leases' locks
            held: list[_Item] = []
            try:
                for item in items:
                    # A run's own thread waits for this item and holds no lock; the
                    # heartbeat holds one only for a renewal.
                    if not item.lease.lock.acquire(timeout=item.lease.length):
                        item.error = Cancelled("the lease stayed busy")
                        item.done.set()
                        continue
                    try:
                        item.lease.check()
                    except Cancelled as e:
                        item.lease.lock.release()
                        item.error = e
                        item.done.set()
                        continue
                    held.append(item)
                if not held:
                    return
                outcomes = keel.transition_tasks(
                    tenant,
                    [
                        {
                            "task_id": i.task.task_id,
                            "expected_version": i.task.state_version,
                            "to_state": i.to_state,
                            "fencing_token": i.lease.token,
                            "release_lease": True,
                        }
                        for i in held
                    ],
                )
                for item, outcome in zip(held, outcomes, strict=True):
                    if outcome.refused is None:
                        item.outcome = outcome
                        item.lease.ended = True
                        continue
                    error = outcome.refused.error or KeelError(outcome.refused.message)
                    if isinstance(error, LeaseLost):
                        item.lease.cancel(f"the database refused the lease: {error.message}")
                    item.error = error
            finally:
                for item in held:
                    item.lease.lock.release()
