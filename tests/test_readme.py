"""The README's worked example runs as written, against a real database."""

from __future__ import annotations

import re
from types import SimpleNamespace

import psycopg

from conftest import REPO


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)


def test_the_worked_example_runs(migrated_db):
    calls = []

    class Payments:
        def refund(self, order: str, amount: int, idempotency_key: str) -> SimpleNamespace:
            calls.append((order, amount, idempotency_key))
            return SimpleNamespace(id="re_123")

    (example,) = [b for b in python_blocks() if "reserve_operation" in b]
    scope = {"dsn": migrated_db, "payments": Payments()}
    exec(compile(example, "README.md", "exec"), scope)
    assert calls == [("A-17", 1200, "refund:A-17")]
    with psycopg.connect(migrated_db) as conn:
        state, version = conn.execute("select state, state_version from keel.tasks").fetchone()
        ops = conn.execute(
            "select state, result, provider_reference from keel.operations"
        ).fetchall()
        outbox = conn.execute("select topic, message_key from keel.outbox").fetchall()
    assert (state, version) == ("done", 3)
    assert ops == [("succeeded", {"refund": "re_123"}, "re_123")]
    assert outbox == [("refund.done", "A-17")]
