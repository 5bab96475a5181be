"""How a call is made: rows mapped to dataclasses by column name, agentkeel SQLSTATEs raised as
agentkeel.errors classes, the tenant context (or an agent's token) set for one transaction,
and parameters adapted (dicts and lists as jsonb)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentkeel.client.rows import BatchError, T
from agentkeel.errors import translate


def dataclass_row(cls: type[T]) -> Callable[[psycopg.Cursor[Any]], Callable[[Sequence[Any]], T]]:
    """A row factory building cls from the columns it declares (newer columns are ignored)."""

    def factory(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], T]:
        names = [c.name for c in cursor.description or ()]

        def make(values: Sequence[Any]) -> T:
            return row_to(cls, dict(zip(names, values, strict=True)))

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


def adapt_json(value: Any) -> Any:
    """A batch item's value as JSON: ids, times and intervals as text."""
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds()} seconds"
    return value


class Array(list[Any]):
    """A list sent as a SQL array (text[], ...), where a plain list is sent as jsonb."""


def adapt(value: Any) -> Any:
    """A call's argument as a bind parameter: dicts and lists as jsonb, an Array as an array."""
    if isinstance(value, Array):
        return list(value)
    if isinstance(value, dict | list):
        return Jsonb(value)
    return value


def batch(tenant_id: uuid.UUID, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The arguments of a batch function (keel.transition_tasks, keel.reserve_operations):
    the tenant, and the items as a jsonb array of objects, each value as JSON."""
    return {
        "tenant_id": tenant_id,
        "items": [{k: adapt_json(v) for k, v in item.items()} for item in items],
    }


def refusal(row: Mapping[str, Any]) -> BatchError | None:
    """A batch row's refusal (refused_sqlstate, refused_message), or None if it succeeded."""
    if not row["refused_sqlstate"]:
        return None
    return BatchError(row["refused_sqlstate"], row["refused_message"])


def row_to(cls: type[T], row: Mapping[str, Any]) -> T:
    """cls from the columns of a row (a dict) it declares, by name."""
    wanted = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in row.items() if k in wanted})
