"""A tenant's quotas from the client: each limit, where it comes from and what the tenant
holds (keel.tenant_quota_status), and the owner's changes (keel.set_tenant_quota), as
`agentkeel tenant quota` runs them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

# The per-tenant quotas keel.set_tenant_quota takes, in the order the status lists them.
SETTINGS = (
    "max_tenant_pending_messages",
    "max_tenant_sessions",
    "max_tenant_checkpoint_bytes",
    "max_task_checkpoints",
    "max_task_step_attempts",
)


@dataclass(frozen=True)
class Quota:
    setting: str
    per: str  # "tenant", or "task": the limit of each of the tenant's tasks
    quota: int
    own: bool  # the tenant's own limit (keel.tenant_quotas), not the one for every tenant
    used: int | None  # what the tenant holds, counted up to the limit; None per task

    def as_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "per": self.per,
            "quota": self.quota,
            "own": self.own,
            "used": self.used,
        }


def set_quotas(
    conn: psycopg.Connection, tenant_id: uuid.UUID, changes: dict[str, int | None]
) -> None:
    """Set (or, with None, remove) the tenant's own limits, all in one transaction."""
    with conn.transaction():
        conn.execute("select keel.use_tenant(%s)", (tenant_id,))
        for setting, value in changes.items():
            conn.execute("select keel.set_tenant_quota(%s, %s, %s)", (tenant_id, setting, value))


def quota_status(conn: psycopg.Connection, tenant_id: uuid.UUID) -> list[Quota]:
    with conn.transaction():
        conn.execute("select keel.use_tenant(%s)", (tenant_id,))
        rows = conn.execute(
            "select setting, per, quota, own, used from keel.tenant_quota_status(%s)",
            (tenant_id,),
        ).fetchall()
    return [
        Quota(str(s), str(p), int(q), bool(o), None if u is None else int(u))
        for s, p, q, o, u in rows
    ]
