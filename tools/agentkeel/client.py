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

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentkeel.checkpoints import (
    CheckpointUnreadable,
    KeyProvider,
    Sealed,
    data_key_context,
    new_data_key,
    payload_context,
    seal,
    unseal,
    uuid7,
)
from agentkeel.errors import ERRORS, InvalidArgument, KeelError, translate
from agentkeel.pooler import is_pooled

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


def dataclass_row(cls: type[T]) -> Callable[[psycopg.Cursor[Any]], Callable[[Sequence[Any]], T]]:
    """A row factory building cls from the columns it declares (newer columns are ignored)."""
    wanted = {f.name for f in fields(cls)}  # type: ignore[arg-type]

    def factory(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], T]:
        names = [c.name for c in cursor.description or ()]

        def make(values: Sequence[Any]) -> T:
            return cls(**{n: v for n, v in zip(names, values, strict=True) if n in wanted})

        return make

    return factory


@contextmanager
def keel_errors() -> Iterator[None]:
    """Re-raise database errors carrying an agentkeel SQLSTATE as agentkeel.errors classes."""
    try:
        yield
    except psycopg.Error as err:
        keel_err = translate(err)
        if keel_err is None:
            raise
        raise keel_err from err


def set_tenant_context(conn: psycopg.Connection, tenant_id: uuid.UUID) -> None:
    """The trusted login's tenant context for the current transaction, and its only.

    keel.use_tenant sets it with SET LOCAL and stamps it with the transaction's start
    (keel.bind_tenant_context), so a value left at session level (by anyone, on a pooled
    server connection) is never honoured; a transaction that already acts for another
    tenant refuses (42K06). One statement, the tenant as a bind parameter: the client
    never sends a multi-statement query string (Citus would send its whole text on).
    """
    conn.execute("select keel.use_tenant(%s)", (tenant_id,))


def set_tenant_token(conn: psycopg.Connection, token: str) -> None:
    """The agent's signed token for the current transaction, as a bind parameter only."""
    conn.execute(
        "select set_config('keel.tenant_token', %s, true), keel.bind_tenant_context()", (token,)
    )


def _adapt_json(value: Any) -> Any:
    """A batch item's value as JSON: ids, times and intervals as text."""
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds()} seconds"
    return value


def _adapt(value: Any) -> Any:
    if isinstance(value, dict | list):
        return Jsonb(value)
    return value


class Keel:
    """The keel function API on one psycopg connection.

    Trusted roles (keel_app, keel_worker) set the tenant per call. An agent session is
    given a signed token instead (``Keel(conn, tenant_token=...)``): for its login role
    the database ignores a plain tenant id.

    Behind a transaction pooler (PgBouncer), a server-side prepared statement made on one
    backend is missing on the next, or another client's of the same name is run. So the
    first call checks whether the connection goes through a pooler (agentkeel.pooler)
    and, if it does, turns prepared statements off on it (``prepare_threshold = None``).
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        tenant_token: str | None = None,
        key_provider: KeyProvider | None = None,
    ) -> None:
        self.conn = conn
        self.tenant_token = tenant_token
        self.key_provider = key_provider
        self.pooled: bool | None = None  # None: not checked yet (the first call does)

    def _check_pooler(self, conn: psycopg.Connection) -> None:
        """Once, before the first call: through a pooler, no prepared statements."""
        if self.pooled is not None:
            return
        self.pooled = is_pooled(conn)
        if self.pooled:
            conn.prepare_threshold = None

    @contextmanager
    def transaction(self, tenant_id: uuid.UUID | None) -> Iterator[psycopg.Connection]:
        """A transaction (or savepoint) with the tenant context set for it alone."""
        with keel_errors(), self.conn.transaction():
            self._check_pooler(self.conn)
            if self.tenant_token is not None:
                set_tenant_token(self.conn, self.tenant_token)
            elif tenant_id is not None:
                set_tenant_context(self.conn, tenant_id)
            yield self.conn

    @contextmanager
    def call_in(self, tenant_id: uuid.UUID | None) -> Iterator[psycopg.Connection]:
        """Where one API call (one statement) runs. On a trusted connection (no tenant
        token) in autocommit with no transaction open: as a statement of its own, one round
        trip; the function takes the tenant it names as the context of that statement's
        transaction (keel.require_tenant). Otherwise in self.transaction(tenant_id): a
        transaction, or a savepoint inside yours, that sets the context first."""
        idle = self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if self.tenant_token is None and self.conn.autocommit and idle:
            with keel_errors():
                self._check_pooler(self.conn)
                yield self.conn
            return
        with self.transaction(tenant_id) as conn:
            yield conn

    def _call(
        self,
        function: str,
        cls: type[T],
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> list[T]:
        """select * from keel.<function>(p_name => value, ...); optional args only when not None."""
        if "tenant_id" in args and args["tenant_id"] is None:
            # Refused here, not sent: Citus 13.2 crashes the coordinator on a NULL
            # distribution argument (docs/citus.md); the database would say the same.
            raise InvalidArgument("a tenant id (not the nil uuid) is required")
        named = dict(args)
        named.update({k: v for k, v in (optional or {}).items() if v is not None})
        query = sql.SQL("select * from keel.{}({})").format(
            sql.Identifier(function),
            sql.SQL(", ").join(
                sql.SQL("{} => {}").format(sql.Identifier(f"p_{name}"), sql.Placeholder())
                for name in named
            ),
        )
        with self.call_in(tenant_id) as conn:
            cur = conn.cursor(row_factory=dataclass_row(cls))
            return cur.execute(query, [_adapt(v) for v in named.values()]).fetchall()

    def _one(
        self,
        function: str,
        cls: type[T],
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> T:
        return self._call(function, cls, tenant_id, args, optional)[0]

    # -- tenancy and workflows --------------------------------------------
    def create_tenant(self, name: str, tenant_id: uuid.UUID | None = None) -> Tenant:
        tid = tenant_id or uuid.uuid4()
        return self._one("create_tenant", Tenant, tid, {"tenant_id": tid, "name": name})

    def mint_tenant_token(
        self, tenant_id: uuid.UUID, ttl: timedelta | None = None, login: str | None = None
    ) -> str:
        """A signed token an agent session uses as its tenant context (G1). With login (a
        login in keel_agent), only that login's sessions can use it."""
        with self.call_in(tenant_id) as conn:
            row = conn.execute(
                "select keel.mint_tenant_token(%s, coalesce(%s, interval '15 minutes'), %s)",
                (tenant_id, ttl, login),
            ).fetchone()
        assert row is not None
        return str(row[0])

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
        args: list[Any] = [workflow, version, initial_state, Jsonb([list(t) for t in transitions])]
        args.append(description)
        # Named only when given, so the call also works against a schema that predates it.
        extra = ", p_terminal_states => %s" if terminal_states is not None else ""
        if terminal_states is not None:
            args.append(list(terminal_states))
        with self.call_in(None) as conn:
            row = conn.execute(
                f"select keel.define_workflow(%s, %s, %s, %s, %s{extra})", args
            ).fetchone()
        return bool(row and row[0])

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

    def task_events(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[TaskEvent]:
        """Every event of the task in seq order (read page by page)."""
        events: list[TaskEvent] = []
        while True:
            page = self._call(
                "task_history",
                TaskEvent,
                tenant_id,
                {"tenant_id": tenant_id, "task_id": task_id},
                {"after_seq": events[-1].seq if events else None, "limit": 1000},
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
        with self.call_in(tenant_id) as conn:
            rows = conn.execute(
                "select item, task_id, refused_sqlstate, refused_message, state, state_version,"
                " fencing_token"
                " from keel.transition_tasks(%s, %s)",
                (tenant_id, Jsonb([{k: _adapt_json(v) for k, v in i.items()} for i in items])),
            ).fetchall()
        return [
            TransitionOutcome(
                r[0], r[1], r[4], r[5], r[6], BatchError(r[2], r[3]) if r[2] else None
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
        with self.call_in(tenant_id) as conn:
            rows = conn.execute(
                "select item, idempotency_key, refused_sqlstate, refused_message, outcome,"
                " operation_id, state,"
                " attempts, result, error, provider_reference, reserved_fencing_token"
                " from keel.reserve_operations(%s, %s)",
                (tenant_id, Jsonb([{k: _adapt_json(v) for k, v in i.items()} for i in items])),
            ).fetchall()
        return [
            ReserveOutcome(
                r[0],
                r[1],
                None if r[2] else Reservation(*r[4:12]),
                BatchError(r[2], r[3]) if r[2] else None,
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

    # -- outbox delivery (G6) --------------------------------------------------
    # The relay's calls (keel_relay) need no tenant context; the consumers' calls do.
    def claim_outbox(
        self,
        relay: str,
        limit: int | None = None,
        lease: timedelta | None = None,
        topic_prefix: str | None = None,
    ) -> list[OutboxMessage]:
        """Claim up to `limit` due messages of any tenant, each with a new claim token."""
        return self._call(
            "claim_outbox",
            OutboxMessage,
            None,
            {"relay": relay},
            {"limit": limit, "lease": lease, "topic_prefix": topic_prefix},
        )

    def ack_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID, claim_token: int) -> None:
        with self.call_in(None) as conn:
            conn.execute("select keel.ack_outbox(%s, %s, %s)", (tenant_id, message_id, claim_token))

    def nack_outbox(
        self,
        tenant_id: uuid.UUID,
        message_id: uuid.UUID,
        claim_token: int,
        error: str,
        *,
        dead: bool | None = None,
    ) -> OutboxMessage:
        return self._one(
            "nack_outbox",
            OutboxMessage,
            None,
            {
                "tenant_id": tenant_id,
                "message_id": message_id,
                "claim_token": claim_token,
                "error": error,
            },
            {"dead": dead},
        )

    def release_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID, claim_token: int) -> None:
        with self.call_in(None) as conn:
            conn.execute(
                "select keel.release_outbox(%s, %s, %s)", (tenant_id, message_id, claim_token)
            )

    def promote_outbox_heads(
        self,
        after: tuple[uuid.UUID, str] | None = None,
        keys: int | None = None,
    ) -> OutboxSweep:
        """The relay's sweep: make claimable each held message with nothing pending ahead
        of it, for up to `keys` keys after the cursor `after` (tenant, key)."""
        return self._one(
            "promote_outbox_heads",
            OutboxSweep,
            None,
            {},
            {
                "after_tenant": after[0] if after else None,
                "after_key": after[1] if after else None,
                "keys": keys,
            },
        )

    def sweep_outbox_heads(self) -> int:
        """The whole sweep, every key from the first (as `agentkeel relay --once` runs it
        before it stops); the heads promoted."""
        promoted, after = 0, None
        while True:
            sweep = self.promote_outbox_heads(after)
            promoted += sweep.promoted
            if sweep.last_tenant is None or sweep.last_key is None:
                return promoted
            after = (sweep.last_tenant, sweep.last_key)

    def outbox_status(self) -> list[OutboxStatus]:
        """Per topic across tenants: pending, in flight, dead, oldest pending age."""
        return self._call("outbox_status", OutboxStatus, None, {})

    def dead_outbox(
        self,
        tenant_id: uuid.UUID,
        *,
        topic: str | None = None,
        after: uuid.UUID | None = None,
        limit: int | None = None,
    ) -> list[OutboxMessage]:
        """One page of the tenant's dead messages in message_id order."""
        return self._call(
            "dead_outbox",
            OutboxMessage,
            tenant_id,
            {"tenant_id": tenant_id},
            {"topic": topic, "after": after, "limit": limit},
        )

    def replay_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID) -> OutboxMessage:
        """A dead message back to pending, same message id, attempts and claims 0."""
        return self._one(
            "replay_outbox",
            OutboxMessage,
            tenant_id,
            {"tenant_id": tenant_id, "message_id": message_id},
        )

    def relay_replay_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID) -> OutboxMessage:
        """replay_outbox for a keel_relay login: any tenant's dead message, no context."""
        return self._one(
            "relay_replay_outbox",
            OutboxMessage,
            None,
            {"tenant_id": tenant_id, "message_id": message_id},
        )

    def inbox_accept(self, tenant_id: uuid.UUID, consumer: str, message_id: uuid.UUID) -> bool:
        """True the first time this consumer accepts the id, False for a duplicate. Call it
        inside the transaction that applies the effect (``with keel.transaction(tenant)``)."""
        with self.call_in(tenant_id) as conn:
            row = conn.execute(
                "select keel.inbox_accept(%s, %s, %s)", (tenant_id, consumer, message_id)
            ).fetchone()
        return bool(row and row[0])

    # -- durable steps (G8) -----------------------------------------------------
    def begin_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        input_hash: str,
        fencing_token: int,
        *,
        retention: timedelta | None = None,
    ) -> StepStart:
        """Reuse the step's stored result (same input hash), or open its next attempt."""
        return self._one(
            "begin_step",
            StepStart,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "input_hash": input_hash,
                "fencing_token": fencing_token,
            },
            {"retention": retention},
        )

    def complete_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        fencing_token: int,
        result: Json,
        *,
        repairs: int | None = None,
    ) -> StepAttempt:
        return self._one(
            "complete_step",
            StepAttempt,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "fencing_token": fencing_token,
                "result": Jsonb(result),
            },
            {"repairs": repairs},
        )

    def fail_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        fencing_token: int,
        error: Json,
        *,
        retryable: bool = False,
        retry_after: timedelta | None = None,
        repairs: int | None = None,
    ) -> StepAttempt:
        return self._one(
            "fail_step",
            StepAttempt,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "fencing_token": fencing_token,
                "error": Jsonb(error),
                "retryable": retryable,
            },
            {"retry_after": retry_after, "repairs": repairs},
        )

    def list_step_attempts(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[StepAttempt]:
        return self._call(
            "list_step_attempts",
            StepAttempt,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id},
        )

    # -- checkpoints (G8, G9, G10) ---------------------------------------------
    def _provider(self) -> KeyProvider:
        if self.key_provider is None:
            raise ValueError(
                "checkpoints are encrypted in the client: give Keel(..., key_provider=...) "
                "(agentkeel.checkpoints.EnvKeyProvider or FileKeyProvider)"
            )
        return self.key_provider

    def _unwrap(
        self, tenant_id: uuid.UUID, wrapped: bytes, wrapping_key_id: str, version: int
    ) -> bytes:
        provider = self._provider()
        if wrapping_key_id != provider.key_id:
            raise CheckpointUnreadable(
                f"data key version {version} was wrapped by key {wrapping_key_id}, "
                f"not by this provider's key {provider.key_id}"
            )
        return provider.unwrap(wrapped, data_key_context(tenant_id))

    def _active_data_key(self, tenant_id: uuid.UUID) -> tuple[int, bytes]:
        """The tenant's active data key, unwrapped; a new one is made when it has none."""
        provider = self._provider()
        with self.transaction(tenant_id) as conn:
            row = conn.execute("select * from keel.tenant_data_key(%s)", (tenant_id,)).fetchone()
            if row is None:
                wrapped = provider.wrap(new_data_key(), data_key_context(tenant_id))
                row = conn.execute(
                    "select * from keel.add_tenant_data_key(%s, %s, %s)",
                    (tenant_id, wrapped, provider.key_id),
                ).fetchone()
        assert row is not None
        version, wrapped_key, wrapping_key_id = row
        return version, self._unwrap(tenant_id, bytes(wrapped_key), wrapping_key_id, version)

    def save_checkpoint(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        fencing_token: int,
        kind: str,
        payload: Json,
        *,
        schema_version: int | None = None,
        step_key: str | None = None,
        ttl: timedelta | None = None,
        checkpoint_id: uuid.UUID | None = None,
    ) -> Checkpoint:
        """Encrypt payload (as JSON) here and store it as ciphertext, fenced by the lease."""
        checkpoint_id = checkpoint_id or uuid7()
        version, data_key = self._active_data_key(tenant_id)
        plaintext = json.dumps(payload, separators=(",", ":")).encode()
        sealed = seal(
            data_key,
            version,
            payload_context(tenant_id, task_id, checkpoint_id, version),
            plaintext,
        )
        return self._one(
            "save_checkpoint",
            Checkpoint,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "checkpoint_id": checkpoint_id,
                "fencing_token": fencing_token,
                "kind": kind,
                "key_version": sealed.key_version,
                "nonce": sealed.nonce,
                "ciphertext": sealed.ciphertext,
                "payload_hash": sealed.payload_hash,
            },
            {"schema_version": schema_version, "step_key": step_key, "ttl": ttl},
        )

    def load_latest_checkpoint(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, kind: str | None = None
    ) -> LoadedCheckpoint | None:
        """The newest valid checkpoint (status ok, not expired), decrypted, or None.
        Raises CheckpointUnreadable when it does not decrypt and DataKeyDestroyed (55K10)
        when its tenant's key was destroyed."""
        with self.call_in(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(
                "select * from keel.latest_checkpoint(%s, %s, %s)", (tenant_id, task_id, kind)
            ).fetchone()
        if row is None:
            return None
        version = int(row["key_version"])
        sealed = Sealed(version, bytes(row["nonce"]), bytes(row["ciphertext"]))
        if sealed.payload_hash != row["payload_hash"]:
            raise CheckpointUnreadable(
                f"checkpoint {row['checkpoint_id']}: the ciphertext does not match its hash"
            )
        data_key = self._unwrap(
            tenant_id, bytes(row["wrapped_key"]), row["wrapping_key_id"], version
        )
        context = payload_context(tenant_id, task_id, row["checkpoint_id"], version)
        payload = json.loads(unseal(data_key, sealed, context))
        wanted = {f.name for f in fields(Checkpoint)}
        checkpoint = Checkpoint(
            tenant_id=tenant_id,
            **{k: v for k, v in row.items() if k in wanted and k != "tenant_id"},
        )
        return LoadedCheckpoint(checkpoint, payload)

    def invalidate_checkpoint(
        self, tenant_id: uuid.UUID, checkpoint_id: uuid.UUID, fencing_token: int
    ) -> Checkpoint:
        return self._one(
            "invalidate_checkpoint",
            Checkpoint,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "checkpoint_id": checkpoint_id,
                "fencing_token": fencing_token,
            },
        )

    def destroy_tenant_data_keys(self, tenant_id: uuid.UUID) -> int:
        """Owner only (G10): erase the tenant's wrapped data keys; its checkpoint payloads
        become unreadable. Returns how many key versions were destroyed."""
        with self.call_in(tenant_id) as conn:
            row = conn.execute("select keel.destroy_tenant_data_keys(%s)", (tenant_id,)).fetchone()
        assert row is not None
        return int(row[0])
