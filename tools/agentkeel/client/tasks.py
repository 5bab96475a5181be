"""Tenants, workflows, tasks, leases and operations (G1-G5)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from agentkeel.client.base import KeelBase
from agentkeel.client.calls import Array, batch, refusal, row_to
from agentkeel.client.rows import (
    Json,
    Operation,
    Reservation,
    ReserveOutcome,
    Task,
    TaskEvent,
    Tenant,
    TransitionOutcome,
)


class TaskCalls(KeelBase):
    """Tenants, workflows, tasks, leases and operations (G1-G5)."""

    # -- tenancy and workflows --------------------------------------------
    def create_tenant(self, name: str, tenant_id: uuid.UUID | None = None) -> Tenant:
        tid = tenant_id or uuid.uuid4()
        return self._one("create_tenant", Tenant, tid, {"tenant_id": tid, "name": name})

    def mint_tenant_token(
        self, tenant_id: uuid.UUID, ttl: timedelta | None = None, login: str | None = None
    ) -> str:
        """A signed token an agent session uses as its tenant context (G1). With login (a
        login in keel_agent), only that login's sessions can use it."""
        return str(
            self._value(
                "mint_tenant_token",
                tenant_id,
                {"tenant_id": tenant_id},
                {"ttl": ttl, "login": login},
            )
        )

    def define_workflow(
        self,
        workflow: str,
        version: int,
        initial_state: str,
        transitions: Sequence[tuple[str, str]],
        description: str | None = None,
        terminal_states: Sequence[str] | None = None,
    ) -> bool:
        """Define a workflow version; True if created, False if the identical one exists.
        Terminal states are those with no outgoing edge; when `terminal_states` is given,
        every such state must be listed there (a dead end that is not is refused)."""
        created = self._value(
            "define_workflow",
            None,
            {
                "workflow": workflow,
                "workflow_version": version,
                "initial_state": initial_state,
                "transitions": [list(t) for t in transitions],
            },
            # Named only when given, so the call also works against a schema that predates it.
            {
                "description": description,
                "terminal_states": Array(terminal_states) if terminal_states is not None else None,
            },
        )
        return bool(created)

    # -- tasks ---------------------------------------------------------------
    def create_task(
        self,
        tenant_id: uuid.UUID,
        workflow: str,
        workflow_version: int,
        *,
        task_id: uuid.UUID | None = None,
        wake_at: datetime | None = None,
        metadata: Json = None,
        actor: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
    ) -> Task:
        return self._one(
            "create_task",
            Task,
            tenant_id,
            {"tenant_id": tenant_id, "workflow": workflow, "workflow_version": workflow_version},
            {
                "task_id": task_id,
                "wake_at": wake_at,
                "metadata": metadata,
                "actor": actor,
                "trace_id": trace_id,
                "span_id": span_id,
            },
        )

    def get_task(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task | None:
        rows = self._call("get_task", Task, tenant_id, {"tenant_id": tenant_id, "task_id": task_id})
        return rows[0] if rows else None

    def list_tasks(
        self,
        tenant_id: uuid.UUID,
        *,
        state: str | None = None,
        after_task_id: uuid.UUID | None = None,
        limit: int | None = None,
    ) -> list[Task]:
        """One page of the tenant's tasks in task_id order; pass the last id for the next."""
        return self._call(
            "list_tasks",
            Task,
            tenant_id,
            {"tenant_id": tenant_id},
            {"state": state, "after_task_id": after_task_id, "limit": limit},
        )

    def task_history(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[TaskEvent]:
        """One page (up to 1000) of the task's events after after_seq, in seq order."""
        return self._call(
            "task_history",
            TaskEvent,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id},
            {"after_seq": after_seq, "limit": limit},
        )

    def task_events(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[TaskEvent]:
        """Every event of the task in seq order (read page by page)."""
        events: list[TaskEvent] = []
        while True:
            page = self.task_history(
                tenant_id, task_id, after_seq=events[-1].seq if events else None, limit=1000
            )
            events.extend(page)
            if len(page) < 1000:
                return events

    def transition_task(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        expected_version: int,
        to_state: str,
        *,
        fencing_token: int | None = None,
        event_type: str | None = None,
        payload: Json = None,
        outbox: Sequence[Mapping[str, Any]] | None = None,
        actor: str | None = None,
        policy_version: str | None = None,
        current_step: str | None = None,
        release_lease: bool | None = None,
        wake_at: datetime | None = None,
    ) -> Task:
        return self._one(
            "transition_task",
            Task,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "expected_version": expected_version,
                "to_state": to_state,
            },
            {
                "fencing_token": fencing_token,
                "event_type": event_type,
                "payload": payload,
                "outbox": list(outbox) if outbox is not None else None,
                "actor": actor,
                "policy_version": policy_version,
                "current_step": current_step,
                "release_lease": release_lease,
                "wake_at": wake_at,
            },
        )

    def transition_tasks(
        self, tenant_id: uuid.UUID, items: Sequence[Mapping[str, Any]]
    ) -> list[TransitionOutcome]:
        """Many transitions of one tenant in one round trip (keel.transition_tasks). Each
        item takes transition_task's arguments by name (task_id, expected_version, to_state,
        fencing_token, payload, outbox, ...) and keeps every guarantee of the single call;
        a refused item wrote nothing and says why, the others are unaffected."""
        rows = self._records("transition_tasks", tenant_id, batch(tenant_id, items))
        return [
            TransitionOutcome(
                r["item"],
                r["task_id"],
                r["state"],
                r["state_version"],
                r["fencing_token"],
                refusal(r),
            )
            for r in rows
        ]

    # -- leases --------------------------------------------------------------
    def claim_lease(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, owner: str, lease: timedelta | None = None
    ) -> Task:
        return self._one(
            "claim_lease",
            Task,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id, "owner": owner},
            {"lease": lease},
        )

    def claim_next_task(
        self, owner: str, lease: timedelta | None = None, workflow: str | None = None
    ) -> Task | None:
        """Lease the longest-due task of any tenant, or None when nothing is due."""
        rows = self._call(
            "claim_next_task", Task, None, {"owner": owner}, {"lease": lease, "workflow": workflow}
        )
        return rows[0] if rows else None

    def claim_next_tasks(
        self,
        owner: str,
        limit: int,
        lease: timedelta | None = None,
        workflow: str | None = None,
    ) -> list[Task]:
        """Lease up to `limit` of the longest-due tasks of any tenant, oldest first, each
        with its own fencing token (one round trip); an empty list when nothing is due."""
        return self._call(
            "claim_next_tasks",
            Task,
            None,
            {"owner": owner, "limit": limit},
            {"lease": lease, "workflow": workflow},
        )

    def renew_lease(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        fencing_token: int,
        lease: timedelta | None = None,
    ) -> Task:
        return self._one(
            "renew_lease",
            Task,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id, "fencing_token": fencing_token},
            {"lease": lease},
        )

    def release_lease(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        fencing_token: int,
        wake_at: datetime | None = None,
    ) -> Task:
        return self._one(
            "release_lease",
            Task,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id, "fencing_token": fencing_token},
            {"wake_at": wake_at},
        )

    # -- operations ------------------------------------------------------------
    def reserve_operation(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID | None,
        idempotency_key: str,
        action: str,
        input_hash: str,
        *,
        fencing_token: int | None = None,
        retention: timedelta | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
    ) -> Reservation:
        return self._one(
            "reserve_operation",
            Reservation,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "idempotency_key": idempotency_key,
                "action": action,
                "input_hash": input_hash,
                "fencing_token": fencing_token,
            },
            {"retention": retention, "trace_id": trace_id, "span_id": span_id},
        )

    def reserve_operations(
        self, tenant_id: uuid.UUID, items: Sequence[Mapping[str, Any]]
    ) -> list[ReserveOutcome]:
        """Many reservations of one tenant in one round trip (keel.reserve_operations). Each
        item takes reserve_operation's arguments by name (idempotency_key, action,
        input_hash, task_id, fencing_token, ...) and keeps every guarantee of the single
        call; a refused item (idempotency_conflict, lease_lost, ...) changed nothing."""
        rows = self._records("reserve_operations", tenant_id, batch(tenant_id, items))
        return [
            ReserveOutcome(
                r["item"],
                r["idempotency_key"],
                None if r["refused_sqlstate"] else row_to(Reservation, r),
                refusal(r),
            )
            for r in rows
        ]

    def complete_operation(
        self,
        tenant_id: uuid.UUID,
        operation_id: uuid.UUID,
        fencing_token: int | None,
        result: Json,
        provider_reference: str | None = None,
    ) -> Operation:
        return self._one(
            "complete_operation",
            Operation,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "operation_id": operation_id,
                "fencing_token": fencing_token,
                "result": Jsonb(result),
            },
            {"provider_reference": provider_reference},
        )

    def fail_operation(
        self,
        tenant_id: uuid.UUID,
        operation_id: uuid.UUID,
        fencing_token: int | None,
        error: Json,
        *,
        retryable: bool = False,
        provider_reference: str | None = None,
    ) -> Operation:
        return self._one(
            "fail_operation",
            Operation,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "operation_id": operation_id,
                "fencing_token": fencing_token,
                "error": Jsonb(error),
                "retryable": retryable,
            },
            {"provider_reference": provider_reference},
        )

    def get_operation(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Operation | None:
        rows = self._call(
            "get_operation",
            Operation,
            tenant_id,
            {"tenant_id": tenant_id, "operation_id": operation_id},
        )
        return rows[0] if rows else None
