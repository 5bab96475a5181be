"""Failpoints: the relay kills itself (SIGKILL) at a chosen step, so tests can prove that a
crash at the worst moment loses nothing (G6).

``AGENTKEEL_RELAY_FAILPOINT=<point>[:N][,<point>[:N]...]`` fires ``point`` in the Nth
non-empty batch this process handles (default: the first). The points:

- ``after_claim``: the claim committed; nothing published yet.
- ``after_publish``: every publish of the batch (or of the group published together: a
  message whose earlier claims ended with no report is published alone) finished, the
  sink confirmed them; no ack yet.
- ``after_ack``: the ack statements of that group ran in their transaction; no commit yet.
- ``poison=TOPIC``: a message that crashes the relay: fires whenever a group about to be
  published holds a message of TOPIC (every batch, not the Nth).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

from agentkeel.exitcodes import AgentkeelError, ExitCode

ENV = "AGENTKEEL_RELAY_FAILPOINT"
POINTS = ("after_claim", "after_publish", "after_ack")


POISON = "poison="


def parse_all(text: str) -> tuple[dict[str, int], frozenset[str]]:
    """({point: batch number}, poison topics) from the variable's value;
    AgentkeelError(USAGE) when malformed."""
    armed: dict[str, int] = {}
    poison: set[str] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item.startswith(POISON) and len(item) > len(POISON):
            poison.add(item[len(POISON) :])
            continue
        point, _, nth = item.partition(":")
        if point not in POINTS or (nth and (not nth.isdigit() or int(nth) < 1)):
            raise AgentkeelError(
                f"${ENV}: {item!r} is not a failpoint: expected one of {', '.join(POINTS)}, "
                "optionally with :N (fire in the Nth batch, N >= 1), or poison=TOPIC",
                ExitCode.USAGE,
            )
        armed[point] = int(nth) if nth else 1
    return armed, frozenset(poison)


def parse(text: str) -> dict[str, int]:
    """{point: batch number} from the variable's value (poison topics left out)."""
    return parse_all(text)[0]


class Failpoints:
    """The armed failpoints of this process (from the environment by default)."""

    def __init__(self, text: str | None = None) -> None:
        self.armed, self.poison = parse_all(os.environ.get(ENV, "") if text is None else text)

    def publishing(self, topics: Iterable[str]) -> None:
        """SIGKILL this process if a message about to be published is of a poison topic."""
        if self.poison and not self.poison.isdisjoint(topics):
            os.kill(os.getpid(), signal.SIGKILL)

    def hit(self, point: str, batch: int) -> None:
        """SIGKILL this process if ``point`` is armed for this batch number."""
        if self.armed.get(point) == batch:
            os.kill(os.getpid(), signal.SIGKILL)
