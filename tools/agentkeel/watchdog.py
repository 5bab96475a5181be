"""The watchdog: keel.watchdog, once or in a loop (`agentkeel watchdog`).

Role settings such as statement_timeout are defaults an agent's session may lift (SET, or
ALTER ROLE on its own login). The watchdog ends, from outside, every backend of a
keel_agent or keel_worker member whose statement, open transaction or idle time inside a
transaction is past the caps in keel.settings (keel.watchdog_caps). This module runs the
call and reports the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from agentkeel.client import dataclass_row


@dataclass(frozen=True)
class Overdue:
    """One backend past a cap; terminated is false in a dry run."""

    pid: int
    login: str
    role_group: str
    measure: str
    elapsed: timedelta
    cap: timedelta
    terminated: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "login": self.login,
            "role_group": self.role_group,
            "measure": self.measure,
            "elapsed_seconds": round(self.elapsed.total_seconds(), 3),
            "cap_seconds": self.cap.total_seconds(),
            "terminated": self.terminated,
        }

    def describe(self) -> str:
        action = "ended" if self.terminated else "past its cap"
        return (
            f"{action:<12} backend {self.pid} of {self.login} ({self.role_group}): "
            f"{self.measure} {self.elapsed.total_seconds():.1f}s > cap "
            f"{self.cap.total_seconds():g}s"
        )


def watch_once(conn: psycopg.Connection, *, terminate: bool = True) -> list[Overdue]:
    """One call of keel.watchdog in a transaction of its own (committed here)."""
    with conn.transaction():
        cur = conn.cursor(row_factory=dataclass_row(Overdue))
        return cur.execute("select * from keel.watchdog(%s)", (terminate,)).fetchall()
