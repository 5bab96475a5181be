"""`agentkeel relay dead list|replay`: the dead letters of every tenant, for the relay's
operator (a keel_relay login), by tenant, topic or message id, without payloads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

PAGE = 500
# Delivery columns only (keel_relay may read no payload or header), oldest death first.
SELECT = (
    "select o.tenant_id, o.message_id, o.topic, o.message_key, o.attempts, o.claims,"
    " o.last_error, o.dead_at from keel.outbox as o where o.state = 'dead'"
    " and (%(tenant)s::uuid is null or o.tenant_id = %(tenant)s::uuid)"
    " and (%(topic)s::text is null or o.topic = %(topic)s::text)"
    " and (%(ids)s::uuid[] is null or o.message_id = any(%(ids)s::uuid[]))"
    " and (o.dead_at, o.message_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)"
    " order by o.dead_at, o.message_id limit %(limit)s"
)
NOT_DEAD = "55K09"


@dataclass(frozen=True)
class Filter:
    tenant: uuid.UUID | None = None
    topic: str | None = None
    ids: Sequence[uuid.UUID] = ()

    @property
    def empty(self) -> bool:
        return self.tenant is None and self.topic is None and not self.ids


@dataclass(frozen=True)
class DeadMessage:
    tenant_id: uuid.UUID
    message_id: uuid.UUID
    topic: str
    message_key: str | None
    attempts: int
    claims: int
    last_error: str | None
    dead_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant_id": str(self.tenant_id),
            "message_id": str(self.message_id),
            "topic": self.topic,
            "key": self.message_key,
            "attempts": self.attempts,
            "claims": self.claims,
            "last_error": self.last_error,
            "dead_at": self.dead_at.isoformat(),
        }


def dead_messages(
    conn: psycopg.Connection[Any], where: Filter, limit: int | None = None
) -> Iterator[DeadMessage]:
    """The dead messages the filter names, oldest death first, a page at a time."""
    after: tuple[Any, uuid.UUID] = ("-infinity", uuid.UUID(int=0))
    left = limit
    while left is None or left > 0:
        page = PAGE if left is None else min(PAGE, left)
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(
            SELECT,
            {
                "tenant": where.tenant,
                "topic": where.topic,
                "ids": list(where.ids) or None,
                "after_at": after[0],
                "after_id": after[1],
                "limit": page,
            },
        ).fetchall()
        for row in rows:
            yield DeadMessage(**row)
        if len(rows) < page:
            return
        after = (rows[-1]["dead_at"], rows[-1]["message_id"])
        if left is not None:
            left -= len(rows)


def replay(conn: psycopg.Connection[Any], message: DeadMessage) -> bool:
    """keel.relay_replay_outbox; False when it is no longer dead (replayed meanwhile)."""
    try:
        conn.execute(
            "select keel.relay_replay_outbox(%s, %s)", (message.tenant_id, message.message_id)
        )
    except psycopg.Error as error:
        if error.sqlstate != NOT_DEAD:
            raise
        return False
    return True
