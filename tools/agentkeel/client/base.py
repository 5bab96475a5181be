"""The client's call path: one statement per call, in autocommit or in a transaction that sets
the tenant context first; a pooler detected on the first call turns prepared statements off."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from agentkeel.checkpoints import KeyProvider
from agentkeel.client.calls import (
    adapt,
    dataclass_row,
    keel_errors,
    set_tenant_context,
    set_tenant_token,
)
from agentkeel.client.rows import T
from agentkeel.errors import InvalidArgument
from agentkeel.pooler import is_pooled


class KeelBase:
    """The keel function API on one psycopg connection.

    Trusted roles (keel_app, keel_worker) set the tenant per call. An agent session is
    given a signed token instead (``Keel(conn, tenant_token=...)``): for its login role
    the database ignores a plain tenant id.

    Behind a transaction pooler (PgBouncer), a server-side prepared statement made on one
    backend is missing on the next, or another client's of the same name is run. So the
    first call checks whether the connection goes through a pooler (agentkeel.pooler)
    and, if it does, turns prepared statements off on it (``prepare_threshold = None``).
    ``detect_pooler=False`` skips that: for a pooler that keeps prepared statements
    (PgBouncer 1.21+ with max_prepared_statements, or session mode).
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        tenant_token: str | None = None,
        key_provider: KeyProvider | None = None,
        detect_pooler: bool = True,
    ) -> None:
        self.conn = conn
        self.tenant_token = tenant_token
        self.key_provider = key_provider
        self.detect_pooler = detect_pooler
        self.pooled: bool | None = None  # None: not checked yet (the first call does)

    def _check_pooler(self, conn: psycopg.Connection) -> None:
        """Once, before the first call: through a pooler, no prepared statements."""
        if self.pooled is not None or not self.detect_pooler:
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
            return cur.execute(query, [adapt(v) for v in named.values()]).fetchall()

    def _one(
        self,
        function: str,
        cls: type[T],
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> T:
        return self._call(function, cls, tenant_id, args, optional)[0]
