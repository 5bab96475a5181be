"""A thin typed client over the keel function API (psycopg 3).

Every call is one statement. On a trusted connection in autocommit it runs on its own,
one round trip: the function takes the tenant it names as the context of that
statement's transaction. Otherwise (an agent's token, or a transaction of yours open) it
runs in a transaction (a savepoint inside yours) that first sets the tenant context for
that transaction alone. Either way a pooled connection never carries a context into the
next transaction. A tenant token is a credential: it is sent only as a bind parameter,
never in query text (which pg_stat_activity shows to every session of the same
login). Database errors with an agentkeel SQLSTATE are raised as the
matching agentkeel.errors class.
"""

from agentkeel.client.calls import (
    dataclass_row,
    keel_errors,
    set_tenant_context,
    set_tenant_token,
)
from agentkeel.client.ledger import LedgerCalls
from agentkeel.client.outbox import OutboxCalls
from agentkeel.client.rows import (
    AckOutcome,
    BatchError,
    Checkpoint,
    LoadedCheckpoint,
    Operation,
    OutboxMessage,
    OutboxStatus,
    OutboxSweep,
    Reservation,
    ReserveOutcome,
    StepAttempt,
    StepStart,
    Task,
    TaskEvent,
    Tenant,
    TransitionOutcome,
)
from agentkeel.client.tasks import TaskCalls


class Keel(TaskCalls, OutboxCalls, LedgerCalls):
    """The keel function API on one psycopg connection.

    Trusted roles (keel_app, keel_worker) set the tenant per call. An agent session is
    given a signed token instead (``Keel(conn, tenant_token=...)``): for its login role
    the database ignores a plain tenant id. Its calls live in modules by layer (tasks,
    outbox, ledger) over one call path (agentkeel.client.base).
    """


__all__ = [
    "AckOutcome",
    "BatchError",
    "Checkpoint",
    "Keel",
    "LoadedCheckpoint",
    "Operation",
    "OutboxMessage",
    "OutboxStatus",
    "OutboxSweep",
    "Reservation",
    "ReserveOutcome",
    "StepAttempt",
    "StepStart",
    "Task",
    "TaskEvent",
    "Tenant",
    "TransitionOutcome",
    "dataclass_row",
    "keel_errors",
    "set_tenant_context",
    "set_tenant_token",
]
