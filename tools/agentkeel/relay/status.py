"""`agentkeel relay status`: the outbox per topic (keel.outbox_status())."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg


@dataclass(frozen=True)
class TopicStatus:
    topic: str
    pending: int
    in_flight: int
    dead: int
    oldest_pending_age: timedelta | None

    def as_json(self) -> dict[str, Any]:
        age = self.oldest_pending_age
        return {
            "topic": self.topic,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_pending_age_s": None if age is None else round(age.total_seconds(), 3),
        }


def read_status(conn: psycopg.Connection) -> list[TopicStatus]:
    rows = conn.execute(
        "select topic, pending, in_flight, dead, oldest_pending_age"
        " from keel.outbox_status() order by topic"
    ).fetchall()
    return [TopicStatus(r[0], int(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows]


def age_text(age: timedelta | None) -> str:
    if age is None:
        return ""
    seconds = age.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
