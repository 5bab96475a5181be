"""Failpoints: the relay kills itself (SIGKILL) at a chosen step, so tests can prove that a
crash at the worst moment loses nothing (G6).

``AGENTKEEL_RELAY_FAILPOINT=<point>[:N][,<point>[:N]...]`` fires ``point`` in the Nth
non-empty batch this process handles (default: the first). The points:

- ``after_claim``: the claim committed; nothing published yet.
- ``after_publish``: every publish of the batch finished (the sink confirmed them); no ack yet.
- ``after_ack``: the ack statements ran in their transaction; the commit has not happened.
"""

from __future__ import annotations

import os
import signal

from agentkeel.exitcodes import AgentkeelError, ExitCode

ENV = "AGENTKEEL_RELAY_FAILPOINT"
POINTS = ("after_claim", "after_publish", "after_ack")


def parse(text: str) -> dict[str, int]:
    """{point: batch number} from the variable's value; AgentkeelError(USAGE) when malformed."""
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, nth = item.partition(":")
        if point not in POINTS or (nth and (not nth.isdigit() or int(nth) < 1)):
            raise AgentkeelError(
                f"${ENV}: {item!r} is not a failpoint: expected one of {', '.join(POINTS)}, "
                "optionally with :N (fire in the Nth batch, N >= 1)",
                ExitCode.USAGE,
            )
        armed[point] = int(nth) if nth else 1
    return armed


class Failpoints:
    """The armed failpoints of this process (from the environment by default)."""

    def __init__(self, text: str | None = None) -> None:
        self.armed = parse(os.environ.get(ENV, "") if text is None else text)

    def hit(self, point: str, batch: int) -> None:
        """SIGKILL this process if ``point`` is armed for this batch number."""
        if self.armed.get(point) == batch:
            os.kill(os.getpid(), signal.SIGKILL)
