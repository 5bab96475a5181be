"""Sessions of chat-loop agents: one snapshot per session plus its step updates.

The rules live in the database (keel.save_session, keel.record_session_update): a completed
or failed step is never replaced by a running update, a terminal outcome only by one with a
higher attempt, and a completed or failed session never becomes active again. They hold for
every writer, concurrent ones included, because each write takes the session row's lock.
This module only calls the functions, each in a transaction of its own (a savepoint inside
yours) with the tenant context set for it, as agentkeel.client.Keel does.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from agentkeel.client import Keel, dataclass_row

Json = Any
SessionStatus = Literal["active", "completed", "failed"]
StepStatus = Literal["running", "completed", "failed"]
TERMINAL = frozenset({"completed", "failed"})


@dataclass(frozen=True)
class Session:
    """The stored snapshot (keel.sessions)."""

    tenant_id: uuid.UUID
    session_id: str
    task_id: uuid.UUID | None
    state: Json
    status: str
    state_version: int
    last_update_seq: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class SessionUpdate:
    """What keel.record_session_update answered: outcome applied (stored with seq) or
    unchanged (the same update was stored before, at seq)."""

    outcome: str
    seq: int
    step_key: str
    status: str
    attempt: int
    result: Json
    error: Json


@dataclass(frozen=True)
class Step:
    """One step of a loaded session: its latest applied update."""

    status: str
    attempt: int
    result: Json
    error: Json
    seq: int
    updated_at: str

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class LoadedSession:
    """keel.load_session: the snapshot with the step updates merged in seq order."""

    session_id: str
    task_id: uuid.UUID | None
    state: Json
    status: str
    state_version: int
    last_update_seq: int
    steps: dict[str, Step]
    created_at: datetime
    updated_at: datetime

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class _LoadedRow:
    session_id: str
    task_id: uuid.UUID | None
    state: Json
    status: str
    state_version: int
    last_update_seq: int
    steps: Json
    created_at: datetime
    updated_at: datetime


class Sessions:
    """The session functions on one psycopg connection.

    Trusted roles (keel_app, keel_worker) set the tenant per call; an agent passes its
    signed token (``Sessions(conn, tenant_token=...)``), sent only as a bind parameter.
    Refusals raise agentkeel.errors classes: SessionUpdateRefused (55K15),
    SessionVersionConflict (55K16), SessionNotFound (42K15), PayloadRejected (22K02), ...
    """

    def __init__(self, conn: psycopg.Connection, tenant_token: str | None = None) -> None:
        self.keel = Keel(conn, tenant_token)

    def save(
        self,
        tenant_id: uuid.UUID,
        session_id: str,
        state: Json,
        *,
        status: SessionStatus = "active",
        task_id: uuid.UUID | None = None,
        expected_version: int | None = None,
    ) -> Session:
        """Create or replace the snapshot; the same snapshot again changes nothing.
        expected_version: the state_version you loaded (0: the session must be new)."""
        with self.keel.transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dataclass_row(Session))
            row = cur.execute(
                "select * from keel.save_session(%s, %s, %s, %s, %s, %s)",
                (tenant_id, session_id, Jsonb(state), status, task_id, expected_version),
            ).fetchone()
        assert row is not None
        return row

    def update(
        self,
        tenant_id: uuid.UUID,
        session_id: str,
        step_key: str,
        status: StepStatus,
        *,
        attempt: int = 1,
        result: Json = None,
        error: Json = None,
        actor: str | None = None,
    ) -> SessionUpdate:
        """Record one step update; a refused one raises SessionUpdateRefused."""
        with self.keel.transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dataclass_row(SessionUpdate))
            row = cur.execute(
                "select * from keel.record_session_update(%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    tenant_id,
                    session_id,
                    step_key,
                    status,
                    attempt,
                    None if result is None else Jsonb(result),
                    None if error is None else Jsonb(error),
                    actor,
                ),
            ).fetchone()
        assert row is not None
        return row

    def load(self, tenant_id: uuid.UUID, session_id: str) -> LoadedSession | None:
        """The session with its steps merged, or None when it does not exist."""
        with self.keel.transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dataclass_row(_LoadedRow))
            row = cur.execute(
                "select * from keel.load_session(%s, %s)", (tenant_id, session_id)
            ).fetchone()
        if row is None:
            return None
        steps = {key: Step(**value) for key, value in dict(row.steps).items()}
        return LoadedSession(
            session_id=row.session_id,
            task_id=row.task_id,
            state=row.state,
            status=row.status,
            state_version=row.state_version,
            last_update_seq=row.last_update_seq,
            steps=steps,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )
