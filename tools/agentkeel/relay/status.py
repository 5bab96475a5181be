"""`agentkeel relay status`: the outbox per topic (keel.outbox_status()) and what was
delivered lately (keel.outbox_delivered())."""

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
    delivered_last_minute: int = 0
    delivered_last_hour: int = 0

    @property
    def per_second(self) -> float:
        """The delivery rate over the last minute."""
        return self.delivered_last_minute / 60

    def as_json(self) -> dict[str, Any]:
        age = self.oldest_pending_age
        return {
            "topic": self.topic,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_pending_age_s": None if age is None else round(age.total_seconds(), 3),
            "delivered_last_minute": self.delivered_last_minute,
            "delivered_last_hour": self.delivered_last_hour,
            "per_second_last_minute": round(self.per_second, 2),
        }


def read_status(conn: psycopg.Connection) -> list[TopicStatus]:
    """Every topic with pending, dead or lately delivered messages, in name order."""
    waiting = {
        r[0]: r
        for r in conn.execute(
            "select topic, pending, in_flight, dead, oldest_pending_age"
            " from keel.outbox_status() order by topic"
        )
    }
    # Two statements: on Citus a join of the two multi-shard counts has no distributed plan.
    last_hour, last_minute = (
        {
            r[0]: int(r[1])
            for r in conn.execute(
                "select topic, delivered from keel.outbox_delivered(%s)", (window,)
            )
        }
        for window in (timedelta(hours=1), timedelta(minutes=1))
    )
    delivered = {t: (last_minute.get(t, 0), n) for t, n in last_hour.items()}
    topics = []
    for topic in sorted(waiting.keys() | delivered.keys()):
        _, pending, in_flight, dead, age = waiting.get(topic, (topic, 0, 0, 0, None))
        minute, hour = delivered.get(topic, (0, 0))
        topics.append(
            TopicStatus(topic, int(pending), int(in_flight), int(dead), age, minute, hour)
        )
    return topics


def age_text(age: timedelta | None) -> str:
    if age is None:
        return ""
    seconds = age.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
