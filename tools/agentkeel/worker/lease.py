"""A held lease as the runtime sees it: its fencing token, the latest moment it is surely
still valid, and whether the handler may still write with it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from agentkeel.worker.outcomes import Cancelled


class Lease:
    """One claimed task's lease. Every write for the task (the handler's, the heartbeat's
    renewal, the runtime's outcome) holds ``lock`` and calls ``check`` first, so nothing is
    written once the lease is lost, given back or past its deadline.

    The deadline is kept on the monotonic clock, counted from when the claim or renewal
    was *sent*: the database's expiry is later than that, so a worker that was paused
    (SIGSTOP, a long GC, a suspended VM) finds its deadline passed and stops before it
    writes, instead of learning it from the database's refusal.
    """

    def __init__(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, token: int, lease: timedelta, sent_at: float
    ) -> None:
        self.tenant_id = tenant_id
        self.task_id = task_id
        self.token = token
        self.length = lease.total_seconds()
        # A write sent right before the deadline still needs time to arrive.
        self.margin = min(1.0, self.length / 10)
        self.deadline = sent_at + self.length
        self.lock = threading.RLock()
        self._guard = threading.Lock()  # the callbacks only: cancel() never waits on a write
        self.cancelled = threading.Event()
        self.reason: str | None = None
        self.ended = False  # a terminal state or a release ended the lease: no renewal
        self.released = False  # given back by the worker (shutdown, no handler)
        self._callbacks: list[Callable[[], None]] = []

    def renewed(self, sent_at: float) -> None:
        self.deadline = sent_at + self.length

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline - self.margin

    def cancel(self, reason: str) -> None:
        with self._guard:
            if self.reason is None:
                self.reason = reason
            self.cancelled.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call callback when the lease is cancelled (at once if it already is)."""
        with self._guard:
            self._callbacks.append(callback)
            now = self.cancelled.is_set()
        if now:
            callback()

    def forget(self, callback: Callable[[], None]) -> None:
        with self._guard:
            self._callbacks.remove(callback)

    def check(self) -> None:
        """Raise Cancelled unless the lease may still be written with."""
        if not self.cancelled.is_set() and self.expired():
            self.cancel("lease expired before it could be renewed")
        if self.cancelled.is_set():
            raise Cancelled(self.reason or "cancelled")
