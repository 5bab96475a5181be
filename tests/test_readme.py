"""The worked example of docs/api.md (linked from the README) runs as written, against a real
database: twice on the same database, as a login role in keel_app and keel_worker, directly
and through PgBouncer."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import conninfo, sql

from conftest import REPO

EXAMPLE_PAGE = "docs/api.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / EXAMPLE_PAGE).read_text(), flags=re.DOTALL)


@pytest.fixture
def example_login(migrated_db: str) -> Iterator[str]:
    """The roles the example names: a login in keel_app and keel_worker."""
    name = f"akt_readme_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            sql.SQL("create role {} login in role keel_app, keel_worker").format(
                sql.Identifier(name)
            )
        )
    yield conninfo.make_conninfo(migrated_db, user=name)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def run_example(dsn: str, calls: list[tuple[str, int, str]]) -> None:
    class Payments:
        def refund(self, order: str, amount: int, idempotency_key: str) -> SimpleNamespace:
            calls.append((order, amount, idempotency_key))
            return SimpleNamespace(id="re_123")

    (example,) = [b for b in python_blocks() if "reserve_operation" in b]
    scope = {"dsn": dsn, "payments": Payments()}
    exec(compile(example, EXAMPLE_PAGE, "exec"), scope)
    if "conn" in scope:
        scope["conn"].close()


def check_two_runs(db: str, calls: list[tuple[str, int, str]]) -> None:
    with psycopg.connect(db) as conn:
        tasks = conn.execute(
            "select task_id, state, state_version from keel.tasks order by task_id"
        ).fetchall()
        ops = conn.execute(
            "select state, result, provider_reference from keel.operations"
        ).fetchall()
        outbox = conn.execute("select topic, message_key from keel.outbox").fetchall()
        tenants = conn.execute("select name from keel.tenants").fetchall()
    assert tenants == [("acme",)]
    assert [(state, version) for _, state, version in tasks] == [("done", 3), ("done", 3)]
    assert sorted(calls) == sorted(("A-17", 1200, f"refund:{t}") for t, _, _ in tasks)
    assert ops == [("succeeded", {"refund": "re_123"}, "re_123")] * 2
    assert outbox == [("refund.done", "A-17")] * 2


def test_the_worked_example_runs_twice(migrated_db, example_login):
    calls: list[tuple[str, int, str]] = []
    run_example(example_login, calls)
    run_example(example_login, calls)
    check_two_runs(migrated_db, calls)


def test_the_worked_example_runs_twice_through_pgbouncer(
    migrated_db, example_login, through_pgbouncer
):
    calls: list[tuple[str, int, str]] = []
    for round_robin in (False, True):
        run_example(through_pgbouncer(example_login, round_robin=round_robin), calls)
    check_two_runs(migrated_db, calls)
