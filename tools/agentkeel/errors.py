"""The agentkeel SQLSTATE registry, mirrored from keel.error_codes(), one class per code."""

from __future__ import annotations

from typing import ClassVar

import psycopg


class KeelError(Exception):
    """A documented agentkeel error raised by the database."""

    sqlstate: ClassVar[str] = ""
    name: ClassVar[str] = ""

    def __init__(self, message: str, detail: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint

    def __str__(self) -> str:
        parts = [f"{self.message} [{self.sqlstate} {self.name}]"]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


class InvalidArgument(KeelError):
    sqlstate = "22K01"
    name = "invalid_argument"


class PayloadRejected(KeelError):
    sqlstate = "22K02"
    name = "payload_rejected"


class IdempotencyConflict(KeelError):
    sqlstate = "23K01"
    name = "idempotency_conflict"


class WorkflowConflict(KeelError):
    sqlstate = "23K02"
    name = "workflow_conflict"


class CheckpointConflict(KeelError):
    sqlstate = "23K10"
    name = "checkpoint_conflict"


class TenantContextMissing(KeelError):
    sqlstate = "42K01"
    name = "tenant_context_missing"


class UnknownTenant(KeelError):
    sqlstate = "42K02"
    name = "unknown_tenant"


class UnknownWorkflow(KeelError):
    sqlstate = "42K03"
    name = "unknown_workflow"


class TaskNotFound(KeelError):
    sqlstate = "42K04"
    name = "task_not_found"


class OperationNotFound(KeelError):
    sqlstate = "42K05"
    name = "operation_not_found"


class TenantContextMismatch(KeelError):
    sqlstate = "42K06"
    name = "tenant_context_mismatch"


class InvalidTenantToken(KeelError):
    sqlstate = "42K07"
    name = "invalid_tenant_token"


class MessageNotFound(KeelError):
    sqlstate = "42K08"
    name = "message_not_found"


class StepNotFound(KeelError):
    sqlstate = "42K10"
    name = "step_not_found"


class DataKeyNotFound(KeelError):
    sqlstate = "42K11"
    name = "data_key_not_found"


class CheckpointNotFound(KeelError):
    sqlstate = "42K12"
    name = "checkpoint_not_found"


class SessionNotFound(KeelError):
    sqlstate = "42K15"
    name = "session_not_found"


class QuotaExceeded(KeelError):
    sqlstate = "54K01"
    name = "quota_exceeded"


class StaleState(KeelError):
    sqlstate = "55K01"
    name = "stale_state"


class IllegalTransition(KeelError):
    sqlstate = "55K02"
    name = "illegal_transition"


class LeaseLost(KeelError):
    sqlstate = "55K03"
    name = "lease_lost"


class LeaseHeld(KeelError):
    sqlstate = "55K04"
    name = "lease_held"


class OperationNotReserved(KeelError):
    sqlstate = "55K05"
    name = "operation_not_reserved"


class TaskNotClaimable(KeelError):
    sqlstate = "55K06"
    name = "task_not_claimable"


class AppendOnlyViolation(KeelError):
    sqlstate = "55K07"
    name = "append_only_violation"


class OutboxClaimLost(KeelError):
    sqlstate = "55K08"
    name = "outbox_claim_lost"


class MessageNotDead(KeelError):
    sqlstate = "55K09"
    name = "message_not_dead"


class DataKeyDestroyed(KeelError):
    sqlstate = "55K10"
    name = "data_key_destroyed"


class SessionUpdateRefused(KeelError):
    sqlstate = "55K15"
    name = "session_update_refused"


class SessionVersionConflict(KeelError):
    sqlstate = "55K16"
    name = "session_version_conflict"


class TenantDeleted(KeelError):
    sqlstate = "55K17"
    name = "tenant_deleted"


ERRORS: dict[str, type[KeelError]] = {cls.sqlstate: cls for cls in KeelError.__subclasses__()}


def translate(err: psycopg.Error) -> KeelError | None:
    """The KeelError for a database error carrying an agentkeel SQLSTATE, else None."""
    cls = ERRORS.get(err.sqlstate or "")
    if cls is None:
        return None
    diag = err.diag
    return cls(diag.message_primary or str(err), diag.message_detail, diag.message_hint)
