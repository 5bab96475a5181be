"""agentkeel.sessions: typed results, merged steps, mapped errors, the caller's transaction."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel.errors import InvalidArgument, SessionUpdateRefused, TaskNotFound
from agentkeel.sessions import LoadedSession, Session, Sessions, SessionUpdate, Step
from conftest import REPO


@pytest.fixture
def conn(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        yield conn


def test_a_session_round_trip_is_typed_and_merged_in_order(conn):
    keel = Keel(conn)
    tenant = keel.create_tenant("t").tenant_id
    keel.define_workflow("chat", 1, "open", [("open", "closed")])
    task = keel.create_task(tenant, "chat", 1)
    sessions = Sessions(conn)
    saved = sessions.save(tenant, "c-1", {"turn": 1}, task_id=task.task_id)
    assert isinstance(saved, Session)
    assert (saved.task_id, saved.status, saved.state_version) == (task.task_id, "active", 1)
    first = sessions.update(tenant, "c-1", "plan", "running", actor="planner")
    assert isinstance(first, SessionUpdate) and (first.outcome, first.seq) == ("applied", 1)
    sessions.update(tenant, "c-1", "plan", "completed", result={"steps": 2})
    sessions.update(tenant, "c-1", "search", "failed", error={"code": 500})
    loaded = sessions.load(tenant, "c-1")
    assert isinstance(loaded, LoadedSession) and not loaded.terminal
    assert loaded.last_update_seq == 3
    assert set(loaded.steps) == {"plan", "search"}
    plan = loaded.steps["plan"]
    assert isinstance(plan, Step) and plan.terminal
    assert (plan.status, plan.result, plan.seq) == ("completed", {"steps": 2}, 2)
    assert loaded.steps["search"].error == {"code": 500}
    assert sessions.load(tenant, "no-such-session") is None


def test_refusals_raise_the_registry_classes_and_write_nothing(conn):
    tenant = Keel(conn).create_tenant("t").tenant_id
    sessions = Sessions(conn)
    sessions.save(tenant, "c-1", {})
    sessions.update(tenant, "c-1", "answer", "completed", result={"text": "hi"})
    with pytest.raises(SessionUpdateRefused) as info:
        sessions.update(tenant, "c-1", "answer", "running")
    assert "already completed" in info.value.message
    with pytest.raises(InvalidArgument):
        sessions.update(tenant, "c-1", "answer", "failed", attempt=2, result={"x": 1})
    with pytest.raises(InvalidArgument):
        sessions.save(tenant, "c-1", {}, status="paused")  # type: ignore[arg-type]
    with pytest.raises(TaskNotFound):
        sessions.save(tenant, "c-2", {}, task_id=uuid.uuid4())
    loaded = sessions.load(tenant, "c-1")
    assert loaded is not None and loaded.last_update_seq == 1


def test_calls_inside_a_caller_transaction_roll_back_with_it(conn):
    tenant = Keel(conn).create_tenant("t").tenant_id
    sessions = Sessions(conn)
    with pytest.raises(RuntimeError), conn.transaction():
        sessions.save(tenant, "c-1", {"turn": 1})
        sessions.update(tenant, "c-1", "answer", "running")
        raise RuntimeError("abort")
    assert sessions.load(tenant, "c-1") is None


def test_the_docs_python_example_runs_as_written(conn):
    text = (REPO / "docs" / "sessions-and-recovery.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    scope = {"conn": conn, "tenant_id": Keel(conn).create_tenant("docs").tenant_id}
    exec(compile(example, "docs/sessions-and-recovery.md", "exec"), scope)
    assert scope["session"].steps["search"].status == "completed"
