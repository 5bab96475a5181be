"""Helpers the tests share: snapshots of a tenant's rows, and racing calls on many connections."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg import sql

TENANT_TABLES = ("tasks", "task_events", "operations", "outbox")


def tenant_snapshot(
    conn: psycopg.Connection, tenant_id: uuid.UUID
) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the tenant owns, table by table, in a stable order: compare two to prove
    that a refused call wrote nothing."""
    snapshot: dict[str, list[tuple[Any, ...]]] = {}
    for table in TENANT_TABLES:
        query = sql.SQL(
            "select to_jsonb(t)::text from keel.{} as t where t.tenant_id = %s order by 1"
        ).format(sql.Identifier(table))
        rows = conn.execute(query, (tenant_id,)).fetchall()
        snapshot[table] = rows
    return snapshot


def race(calls: Sequence[Callable[[], Any]], timeout: float = 60) -> list[tuple[str, Any]]:
    """Start every call at the same instant (one thread each, a barrier between them) and
    return ("ok", value) or ("error", exception) per call, in order."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> tuple[str, Any]:
        barrier.wait(timeout)
        try:
            return ("ok", call())
        except Exception as exc:
            return ("error", exc)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, call) for call in calls]
        return [f.result(timeout) for f in futures]
