"""Tenant deletion (G10), from the client: what a tenant has (keel.tenant_rows) and the
loop of bounded steps that deletes it (keel.delete_tenant, one transaction per step), as
`agentkeel tenant delete` runs them. The database keeps the state, so the loop resumes
wherever an earlier run stopped."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

EventsPolicy = Literal["tombstone", "remove"]


@dataclass
class Deletion:
    """What one deletion did: rows removed per table (this run), and the database's record
    of the deletion (keel.tenant_deletions) once it has begun."""

    tenant_id: uuid.UUID
    events: EventsPolicy
    removed: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    data_keys_destroyed: int | None = None
    tombstones: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant_id": str(self.tenant_id),
            "events": self.events,
            "finished": self.finished,
            "removed": self.removed,
            "data_keys_destroyed": self.data_keys_destroyed,
            "tombstones": self.tombstones,
        }


def tenant_rows(conn: psycopg.Connection, tenant_id: uuid.UUID) -> dict[str, int]:
    """The tenant's rows per tenant table, in deletion order (keel.tenants last)."""
    with conn.transaction():
        conn.execute("select keel.use_tenant(%s)", (tenant_id,))
        rows = conn.execute(
            "select relation, row_count from keel.tenant_rows(%s)", (tenant_id,)
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def wrapping_key_ids(conn: psycopg.Connection, tenant_id: uuid.UUID) -> set[str]:
    """The key_id of every key provider that wrapped one of the tenant's data keys."""
    with conn.transaction():
        conn.execute("select keel.use_tenant(%s)", (tenant_id,))
        rows = conn.execute(
            "select distinct wrapping_key_id from keel.tenant_data_keys where tenant_id = %s",
            (tenant_id,),
        ).fetchall()
    return {str(r[0]) for r in rows}


def delete_steps(
    conn: psycopg.Connection, tenant_id: uuid.UUID, events: EventsPolicy, batch: int
) -> Iterator[list[tuple[str, int, bool]]]:
    """Call keel.delete_tenant until it reports the tenant gone, one transaction per call;
    yield each call's rows (table, removed, finished)."""
    while True:
        with conn.transaction():
            rows = conn.execute(
                "select relation, removed, finished from keel.delete_tenant(%s, %s, %s)",
                (tenant_id, events, batch),
            ).fetchall()
        step = [(str(r[0]), int(r[1]), bool(r[2])) for r in rows]
        yield step
        if any(finished for _, _, finished in step):
            return


def delete_tenant(
    conn: psycopg.Connection,
    tenant_id: uuid.UUID,
    events: EventsPolicy = "tombstone",
    batch: int = 1000,
    progress: Callable[[int], None] | None = None,
    begun: Callable[[], None] | None = None,
) -> Deletion:
    """Delete the tenant to the end (or resume its deletion); begun() once the first step
    has committed (the deletion is recorded and the tenant refused: the moment to destroy
    what is kept outside the database, such as its keyring key); progress(n) after each
    step with the rows it removed. Needs the owner (a keel_migrator login)."""
    deletion = Deletion(tenant_id, events)
    for number, step in enumerate(delete_steps(conn, tenant_id, events, batch)):
        if number == 0 and begun is not None:
            begun()
        for relation, removed, finished in step:
            if relation != "None" and removed:
                deletion.removed[relation] = deletion.removed.get(relation, 0) + removed
            deletion.finished = deletion.finished or finished
        if progress is not None:
            progress(sum(removed for _, removed, _ in step))
    row = conn.execute(
        "select d.data_keys_destroyed,"
        " (select count(*) from keel.task_event_tombstones as e"
        "  where e.deleted_tenant_id = d.deleted_tenant_id)"
        " from keel.tenant_deletions as d where d.deleted_tenant_id = %s",
        (tenant_id,),
    ).fetchone()
    if row is not None:
        deletion.data_keys_destroyed, deletion.tombstones = int(row[0]), int(row[1])
    return deletion
