"""A tenant with rows in every kind of tenant table, written through the API as an
application would: what the tenant-deletion tests (G10) delete, and what they compare the
other tenants' rows against."""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import timedelta

import psycopg

from agentkeel.checkpoints import StaticKeyProvider
from agentkeel.client import Keel
from agentkeel.sessions import Sessions

# The suite's workflow edges (fixtures.EDGES) this walks: queued -> running -> done.
FILL_KEY = StaticKeyProvider(hashlib.sha256(b"agentkeel-conformance-g10").digest())


def fill_tenant(
    conn: psycopg.Connection,
    tenant: uuid.UUID,
    workflow: str,
    tasks: int = 2,
    topic: str = "g10.filled",
) -> None:
    """For each of `tasks` tasks: a lease, a transition with an outbox message, an
    operation and a step attempt, a checkpoint (so a data key and a payload), a session
    with an update; then an inbox row. conn is a keel_app or keel_worker login (autocommit)."""
    keel = Keel(conn, key_provider=FILL_KEY)
    sessions = Sessions(conn)
    for n in range(tasks):
        task = keel.create_task(tenant, workflow, 1, metadata={"n": n})
        lease = keel.claim_lease(tenant, task.task_id, "g10", timedelta(minutes=5))
        token = lease.fencing_token
        moved = keel.transition_task(
            tenant,
            task.task_id,
            lease.state_version,
            "running",
            fencing_token=token,
            payload={"n": n},
            outbox=[{"topic": topic, "payload": {"n": n}}],
        )
        keel.begin_step(tenant, task.task_id, "plan", hashlib.sha256(b"in").hexdigest(), token)
        keel.complete_step(tenant, task.task_id, "plan", token, {"plan": n})
        keel.save_checkpoint(
            tenant, task.task_id, token, "INPUT", {"secret-ish": os.urandom(8).hex()}
        )
        sessions.save(tenant, f"s-{n}", {"turn": n}, task_id=task.task_id)
        sessions.update(tenant, f"s-{n}", "plan", "running")
        keel.transition_task(tenant, task.task_id, moved.state_version, "done", fencing_token=token)
    keel.inbox_accept(tenant, "g10-consumer", uuid.uuid4())
