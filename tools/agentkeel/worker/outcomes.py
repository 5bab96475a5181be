"""What a handler may raise to say how its task goes on, and the cancellation it is given."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class Cancelled(BaseException):
    """The handler's work must stop: its lease was lost (refused by the database, or past
    its expiry without a renewal) or the worker is shutting down and gave the task back.

    A BaseException, like asyncio.CancelledError, so that a handler's ``except Exception``
    does not swallow it. Every Context call raises it once the task is cancelled, before
    anything is written: a cancelled handler cannot write with its old fencing token.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Retry(Exception):
    """Try the task again later: a retry like any exception's, counted against the
    handler's max_attempts; ``delay`` replaces the backoff when given."""

    def __init__(self, reason: str = "retry requested", delay: timedelta | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Snooze(Exception):
    """Run the task again after ``delay`` without counting an attempt (waiting on something
    outside: a rate limit, a human)."""

    def __init__(self, delay: timedelta) -> None:
        super().__init__(f"snoozed for {delay}")
        self.delay = delay


class Fail(Exception):
    """Fail the task now, without retrying: it moves to the handler's failed state."""


class MoveTo(Exception):
    """Move the task to ``state`` (a legal edge of its workflow) and end this run."""

    def __init__(self, state: str, payload: dict[str, Any] | None = None) -> None:
        super().__init__(f"move to {state}")
        self.state = state
        self.payload = payload


class StepFailed(Exception):
    """A step's stored failure is final (keel.begin_step answered ``failed``): running the
    task again cannot change it, so the task fails unless the handler catches this."""

    def __init__(self, step_key: str, error: Any) -> None:
        super().__init__(f"step {step_key!r} failed for good: {error}")
        self.step_key = step_key
        self.error = error
