"""Which run of a task this is, read from its history, and how long a retry waits."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import timedelta

from agentkeel.client.rows import TaskEvent

RETRY_EVENT = "RETRY_SCHEDULED"
SNOOZE_EVENT = "TASK_SNOOZED"
FAILED_EVENT = "TASK_FAILED"
ERROR_EVENT = "TASK_ERROR"

# Events read per page while looking back for the last move.
WINDOW = 32


def backoff(
    attempt: int,
    base: timedelta,
    cap: timedelta,
    rng: Callable[[], float] = random.random,
) -> timedelta:
    """The wait before retry ``attempt`` (1 after the first failed run): full jitter,
    random() * min(cap, base * 2 ** (attempt - 1)), as keel.outbox_backoff."""
    exponent = min(max(attempt - 1, 0), 60)
    ceiling = min(cap.total_seconds(), base.total_seconds() * 2.0**exponent)
    return timedelta(seconds=rng() * max(ceiling, 0.0))


def runs_so_far(events: Sequence[TaskEvent]) -> int | None:
    """How many runs of the task's current state ended in a retry, from its latest events
    (in seq order): the retry count of the last move if that move was a retry, 0 if it was
    another move; None when these events hold no move (look further back).

    A move changes the state version; a step's reuse, a recovery and a snooze do not count
    here: a snooze is a self-edge the handler asked for, and the events that are not moves
    (STEP_RESULT_REUSED, RECOVERED) keep the state and version. A retry's payload holds
    its attempt number, written by the runtime itself."""
    for event in reversed(events):
        if event.event_type == SNOOZE_EVENT:
            continue
        if event.from_state == event.to_state and event.event_type != RETRY_EVENT:
            continue
        if event.event_type == RETRY_EVENT and isinstance(event.payload, dict):
            attempt = event.payload.get("attempt")
            if isinstance(attempt, int) and attempt >= 0:
                return attempt
        return 0
    return None
