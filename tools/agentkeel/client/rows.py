"""What the keel functions return, as typed rows (one frozen dataclass per row shape)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from agentkeel.errors import ERRORS, KeelError

T = TypeVar("T")
Json = Any


@dataclass(frozen=True)
class Tenant:
    tenant_id: uuid.UUID
    name: str
    created_at: datetime


@dataclass(frozen=True)
class Task:
    tenant_id: uuid.UUID
    task_id: uuid.UUID
    workflow: str
    workflow_version: int
    state: str
    state_version: int
    last_event_seq: int
    current_step: str | None
    wake_at: datetime | None
    lease_owner: str | None
    fencing_token: int
    lease_acquired_at: datetime | None
    lease_expires_at: datetime | None
    trace_id: str | None
    span_id: str | None
    metadata: Json
    created_at: datetime
    updated_at: datetime
    # Takeovers of a lease that expired unreleased (G5); 0 from a schema before it existed.
    recovery_attempts: int = 0


@dataclass(frozen=True)
class TaskEvent:
    tenant_id: uuid.UUID
    task_id: uuid.UUID
    seq: int
    event_type: str
    from_state: str | None
    to_state: str
    state_version: int
    actor: str
    claimed_actor: str | None
    policy_version: str | None
    fencing_token: int | None
    payload: Json
    trace_id: str | None
    span_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class Reservation:
    """What keel.reserve_operation answered.

    outcome: reserved, in_progress, succeeded or failed.
    """

    outcome: str
    operation_id: uuid.UUID
    state: str
    attempts: int
    result: Json
    error: Json
    provider_reference: str | None
    reserved_fencing_token: int | None


@dataclass(frozen=True)
class Operation:
    tenant_id: uuid.UUID
    operation_id: uuid.UUID
    task_id: uuid.UUID | None
    idempotency_key: str
    action: str
    input_hash: str
    state: str
    provider_reference: str | None
    result: Json
    error: Json
    attempts: int
    reserved_fencing_token: int | None
    trace_id: str | None
    span_id: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    expires_at: datetime


@dataclass(frozen=True)
class BatchError:
    """One batch item's refusal: the SQLSTATE and message the single call would have raised
    (nothing was written for that item). error is the agentkeel.errors instance when the
    SQLSTATE is one of agentkeel's."""

    sqlstate: str
    message: str

    @property
    def error(self) -> KeelError | None:
        cls = ERRORS.get(self.sqlstate)
        return cls(self.message) if cls is not None else None


@dataclass(frozen=True)
class TransitionOutcome:
    """One item of keel.transition_tasks: the task's new state, or why not."""

    item: int
    task_id: uuid.UUID
    state: str | None
    state_version: int | None
    fencing_token: int | None
    refused: BatchError | None


@dataclass(frozen=True)
class ReserveOutcome:
    """One item of keel.reserve_operations: what keel.reserve_operation answered, or why not."""

    item: int
    idempotency_key: str
    reservation: Reservation | None
    refused: BatchError | None


@dataclass(frozen=True)
class AckOutcome:
    """One item of keel.ack_outbox_messages: acked (refused is None), or why not."""

    item: int
    message_id: uuid.UUID
    refused: BatchError | None


@dataclass(frozen=True)
class OutboxMessage:
    tenant_id: uuid.UUID
    message_id: uuid.UUID
    task_id: uuid.UUID | None
    event_seq: int | None
    position: int
    topic: str
    message_key: str | None
    payload: Json
    headers: Json
    state: str
    attempts: int
    available_at: datetime
    created_at: datetime
    delivered_at: datetime | None
    last_error: str | None
    claim_token: int
    claimed_by: str | None
    claimed_at: datetime | None
    dead_at: datetime | None
    # Claims since the last nack or replay (migration 0034; 0 before it).
    claims: int = 0
    # Held behind an earlier pending message of its key (migration 0037; False before it).
    held: bool = False


@dataclass(frozen=True)
class OutboxSweep:
    """One call of the relay's sweep (keel.promote_outbox_heads): keys looked at, heads
    promoted, and the cursor for the next call (None once the last key was looked at)."""

    keys: int
    promoted: int
    last_tenant: uuid.UUID | None
    last_key: str | None


@dataclass(frozen=True)
class OutboxStatus:
    topic: str
    pending: int
    in_flight: int
    dead: int
    oldest_pending_age: timedelta | None


@dataclass(frozen=True)
class StepStart:
    """What keel.begin_step answered.

    outcome: started (run the step, then complete_step or fail_step), reused (result is the
    stored one: do not run it), in_progress, retry_later (not before next_retry_at) or
    failed (error is the stored one).
    """

    outcome: str
    operation_id: uuid.UUID
    attempt: int
    result: Json
    error: Json
    next_retry_at: datetime | None


@dataclass(frozen=True)
class StepAttempt:
    tenant_id: uuid.UUID
    task_id: uuid.UUID
    step_key: str
    attempt: int
    operation_id: uuid.UUID
    input_hash: str
    status: str
    fencing_token: int
    retryable: bool
    next_retry_at: datetime | None
    repair_count: int
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class Checkpoint:
    tenant_id: uuid.UUID
    checkpoint_id: uuid.UUID
    task_id: uuid.UUID
    seq: int
    kind: str
    step_key: str | None
    schema_version: int
    payload_hash: str
    status: str
    fencing_token: int
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint and its decrypted payload."""

    checkpoint: Checkpoint
    payload: Json
