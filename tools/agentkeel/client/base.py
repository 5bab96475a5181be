"""The client's call path: one statement per call, in autocommit or in a transaction that sets
the tenant context first; a pooler detected on the first call turns prepared statements off."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

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
        """select * from keel.<function>(p_name => value, ...), each row as a cls built from
        the columns it declares, by name; optional args only when not None."""
        with self.call_in(tenant_id) as conn:
            return run(conn, function, dataclass_row(cls), args, optional)

    def _one(
        self,
        function: str,
        cls: type[T],
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> T:
        return self._call(function, cls, tenant_id, args, optional)[0]

    def _records(
        self,
        function: str,
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The rows of keel.<function>(...) as dicts, by column name."""
        with self.call_in(tenant_id) as conn:
            return run(conn, function, dict_row, args, optional)

    def _value(
        self,
        function: str,
        tenant_id: uuid.UUID | None,
        args: Mapping[str, Any],
        optional: Mapping[str, Any] | None = None,
    ) -> Any:
        """What a function returning one value (or void) returned."""
        with self.call_in(tenant_id) as conn:
            return run(conn, function, None, args, optional)[0][0]


def statement(function: str, names: Sequence[str], *, rows: bool) -> sql.Composed:
    """select * from keel.<function>(p_name => %s, ...), or select keel.<function>(...) for a
    function returning one value: the one way a call's text is built, arguments always by
    name and as bind parameters."""
    arguments = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(f"p_{name}"), sql.Placeholder()) for name in names
    )
    template = "select * from keel.{}({})" if rows else "select keel.{}({})"
    return sql.SQL(template).format(sql.Identifier(function), arguments)


def run(
    conn: psycopg.Connection,
    function: str,
    row_factory: Any,
    args: Mapping[str, Any],
    optional: Mapping[str, Any] | None = None,
) -> list[Any]:
    """One call of keel.<function> on conn; with no row_factory, the tuples of
    select keel.<function>(...). Optional args are named only when not None, so a call
    also works against a schema whose function predates them."""
    if "tenant_id" in args and args["tenant_id"] is None:
        # Refused here, not sent: Citus 13.2 crashes the coordinator on a NULL
        # distribution argument (docs/citus.md); the database would say the same.
        raise InvalidArgument("a tenant id (not the nil uuid) is required")
    named = dict(args)
    named.update({k: v for k, v in (optional or {}).items() if v is not None})
    query = statement(function, list(named), rows=row_factory is not None)
    params = [adapt(v) for v in named.values()]
    if row_factory is None:
        return conn.execute(query, params).fetchall()
    return conn.cursor(row_factory=row_factory).execute(query, params).fetchall()
