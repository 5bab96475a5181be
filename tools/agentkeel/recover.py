"""The recoverer: keel.recover_stale_tasks, once or in a loop (`agentkeel recover`).

Every task of any tenant whose lease expired unreleased is taken over in the database (the
fencing token increments, so the dead worker's late writes get lease_lost), recorded with a
RECOVERED event and made due again for claim_next_task; past settings.max_recovery_attempts
it fails with a RECOVERY_EXHAUSTED event. This module runs the call and reports the rows.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from agentkeel.client import dataclass_row


@dataclass(frozen=True)
class Recovery:
    """One task the recoverer handled. outcome: recovered (due again) or exhausted (failed)."""

    tenant_id: uuid.UUID
    task_id: uuid.UUID
    outcome: str
    state: str
    recovery_attempts: int
    fencing_token: int
    previous_owner: str | None
    lease_expired_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("tenant_id", "task_id"):
            data[key] = str(data[key])
        if self.lease_expired_at is not None:
            data["lease_expired_at"] = self.lease_expired_at.isoformat()
        return data

    def describe(self) -> str:
        what = (
            f"recovered (attempt {self.recovery_attempts}), due again in state {self.state}"
            if self.outcome == "recovered"
            else f"recovery exhausted after {self.recovery_attempts} attempt(s): state {self.state}"
        )
        return (
            f"{self.outcome:<9} tenant {self.tenant_id} task {self.task_id}: {what}; "
            f"lease of {self.previous_owner} expired {self.lease_expired_at}, "
            f"token now {self.fencing_token}"
        )


def fit_limit(conn: psycopg.Connection, limit: int) -> int:
    """The batch a round asks for: limit, or the database's settings.max_batch_items
    (keel.max_batch_items) when that is lower, as the relay fits its batch. A schema from
    before that function (it took 1 to 10,000 a call) gets limit as it is."""
    with conn.transaction():
        row = conn.execute(
            "select to_regprocedure('keel.max_batch_items()') is not null"
        ).fetchone()
        if not (row and row[0]):
            return limit
        row = conn.execute("select keel.max_batch_items()").fetchone()
    return min(limit, int(row[0])) if row else limit


def recover_once(
    conn: psycopg.Connection,
    *,
    limit: int = 100,
    actor: str | None = None,
    workflow: str | None = None,
    max_attempts: int | None = None,
) -> list[Recovery]:
    """One call of keel.recover_stale_tasks in a transaction of its own (committed here)."""
    with conn.transaction():
        cur = conn.cursor(row_factory=dataclass_row(Recovery))
        return cur.execute(
            "select * from keel.recover_stale_tasks(%s, %s, %s, %s)",
            (limit, actor, workflow, max_attempts),
        ).fetchall()
