"""Sessions of chat-loop agents, G3 for their outcomes: a completed or failed step is never
replaced by a running update, a terminal outcome only by one with a higher attempt, and a
completed or failed session never becomes active again. The database decides, under the
session row's lock, for every writer: one after the other, in the same instant, or racing.
(The interleavings are in specs/session_*.spec.)"""

from __future__ import annotations

import functools
import uuid

import pytest

from agentkeel.errors import (
    PayloadRejected,
    SessionNotFound,
    SessionUpdateRefused,
    SessionVersionConflict,
    TenantContextMismatch,
)
from agentkeel.sessions import LoadedSession, Sessions
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant, race, tenant_snapshot

pytestmark = pytest.mark.guarantee("G3")


@pytest.fixture
def sessions(connect) -> Sessions:
    return Sessions(connect())


def new_session(sessions: Sessions, tenant: uuid.UUID) -> str:
    session_id = f"chat-{uuid.uuid4().hex[:8]}"
    sessions.save(tenant, session_id, {"turn": 0})
    return session_id


def loaded(sessions: Sessions, tenant: uuid.UUID, session_id: str) -> LoadedSession:
    found = sessions.load(tenant, session_id)
    assert found is not None, f"session {session_id} is missing"
    return found


def test_a_finished_step_is_never_replaced_by_a_running_update(sessions, connect, tenant):
    """Mutation: session_terminal_overwritten."""
    sid = new_session(sessions, tenant)
    sessions.update(tenant, sid, "answer", "running")
    done = sessions.update(tenant, sid, "answer", "completed", result={"text": "42"})
    owner = connect(owner=True)
    before = tenant_snapshot(owner, tenant)
    for attempt in (1, 2):  # late progress of this attempt, or of a retry
        with pytest.raises(SessionUpdateRefused) as info:
            sessions.update(tenant, sid, "answer", "running", attempt=attempt)
        assert info.value.sqlstate == "55K15"
    assert tenant_snapshot(owner, tenant) == before, "a refused update wrote something"
    step = loaded(sessions, tenant, sid).steps["answer"]
    assert (step.status, step.attempt, step.result, step.seq) == (
        "completed",
        1,
        {"text": "42"},
        done.seq,
    )


def test_a_higher_attempt_replaces_a_terminal_outcome_and_nothing_else_does(sessions, tenant):
    """A successful retry clears a failure, and a failed re-run replaces a success; an
    older or equal attempt never replaces a terminal outcome; the stored update sent again
    changes nothing.
    Mutation: session_terminal_overwritten."""
    sid = new_session(sessions, tenant)
    failed = sessions.update(tenant, sid, "tool", "failed", error={"code": "timeout"})
    replay = sessions.update(tenant, sid, "tool", "failed", error={"code": "timeout"})
    assert (replay.outcome, replay.seq) == ("unchanged", failed.seq)
    with pytest.raises(SessionUpdateRefused):
        sessions.update(tenant, sid, "tool", "completed", result={"ok": True})  # same attempt
    retried = sessions.update(tenant, sid, "tool", "completed", attempt=2, result={"ok": True})
    assert retried.outcome == "applied"
    step = loaded(sessions, tenant, sid).steps["tool"]
    assert (step.status, step.attempt, step.error) == ("completed", 2, None)
    with pytest.raises(SessionUpdateRefused):  # a late failure of the first attempt
        sessions.update(tenant, sid, "tool", "failed", attempt=1, error={"code": "late"})
    sessions.update(tenant, sid, "tool", "failed", attempt=3, error={"code": "rerun"})
    step = loaded(sessions, tenant, sid).steps["tool"]
    assert (step.status, step.attempt, step.result, step.error) == (
        "failed",
        3,
        None,
        {"code": "rerun"},
    )


def test_a_finished_session_never_becomes_active_again(sessions, tenant):
    """Mutation: session_terminal_overwritten."""
    sid = new_session(sessions, tenant)
    sessions.update(tenant, sid, "answer", "running")
    finished = sessions.save(tenant, sid, {"turn": 3}, status="completed")
    with pytest.raises(SessionUpdateRefused):
        sessions.save(tenant, sid, {"turn": 4}, status="active")
    with pytest.raises(SessionUpdateRefused):
        sessions.update(tenant, sid, "answer", "running", attempt=2)
    sessions.update(tenant, sid, "answer", "completed", result={"text": "late but final"})
    session = loaded(sessions, tenant, sid)
    assert (session.status, session.state, session.state_version) == (
        "completed",
        {"turn": 3},
        finished.state_version,
    )
    assert session.steps["answer"].status == "completed"
    # The other terminal status may replace it, as a new outcome of the session.
    assert sessions.save(tenant, sid, {"turn": 3}, status="failed").status == "failed"


def test_racing_updates_never_leave_a_finished_step_behind_a_running_one(connect, tenant):
    """Writers report the same step at the same instant, some still running, some done;
    whatever order the database serializes them in, a running update never follows a
    terminal one, the sequence has no gap, and the merged step is completed.
    Mutation: session_terminal_overwritten."""
    setup = Sessions(connect())
    writers = [Sessions(connect()) for _ in range(6)]
    for _ in range(4):
        sid = new_session(setup, tenant)
        calls = [
            functools.partial(
                w.update,
                tenant,
                sid,
                "answer",
                "completed" if i % 2 else "running",
                result={"text": "done"} if i % 2 else None,
            )
            for i, w in enumerate(writers)
        ]
        outcomes = race(calls)
        for kind, value in outcomes:
            assert kind == "ok" or isinstance(value, SessionUpdateRefused), value
        owner = connect(owner=True)
        with in_tenant(owner, tenant):
            log = owner.execute(
                "select seq, status from keel.session_updates"
                " where tenant_id = %s and session_id = %s order by seq",
                (tenant, sid),
            ).fetchall()
        statuses = [status for _, status in log]
        assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
        assert "completed" in statuses
        assert "running" not in statuses[statuses.index("completed") :], statuses
        session = loaded(setup, tenant, sid)
        assert session.steps["answer"].status == "completed"
        assert session.last_update_seq == len(log)


def test_a_save_over_a_newer_version_is_refused_and_a_replay_changes_nothing(sessions, tenant):
    """No mutation: save_session's version check has no planted bug."""
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    first = sessions.save(tenant, sid, {"turn": 1}, expected_version=0)
    assert sessions.save(tenant, sid, {"turn": 1}).state_version == first.state_version
    second = sessions.save(tenant, sid, {"turn": 2}, expected_version=first.state_version)
    assert second.state_version == first.state_version + 1
    with pytest.raises(SessionVersionConflict):
        sessions.save(tenant, sid, {"turn": 3}, expected_version=first.state_version)
    with pytest.raises(SessionVersionConflict):
        sessions.save(tenant, f"{sid}-new", {"turn": 1}, expected_version=4)
    assert sessions.load(tenant, f"{sid}-new") is None
    with pytest.raises(SessionNotFound):
        sessions.update(tenant, f"{sid}-new", "answer", "running")


@pytest.mark.guarantee("G9")
@pytest.mark.parametrize(
    "call",
    ["state", "result", "error"],
)
def test_session_payloads_refuse_secret_bearing_keys(sessions, tenant, call):
    """Mutation: keys_unchecked."""
    sid = new_session(sessions, tenant)
    secret = {"auth": {"api_key": "sk-live-123"}}
    with pytest.raises(PayloadRejected) as info:
        if call == "state":
            sessions.save(tenant, sid, secret)
        elif call == "result":
            sessions.update(tenant, sid, "tool", "completed", result=secret)
        else:
            sessions.update(tenant, sid, "tool", "failed", error=secret)
    assert "sk-live-123" not in str(info.value)


@pytest.mark.guarantee("G1")
def test_an_agent_reaches_its_own_sessions_only(app_keel, make_tenant, login_role):
    """Mutation: plain_tenant_id."""
    mine, theirs = make_tenant(), make_tenant()
    with suite_connect(login_role("keel_app").dsn, autocommit=True) as conn:
        Sessions(conn).save(theirs, "shared-name", {"owner": "theirs"})
    token = app_keel.mint_tenant_token(mine)
    with suite_connect(login_role("keel_agent").dsn, autocommit=True) as conn:
        agent = Sessions(conn, tenant_token=token)
        agent.save(mine, "shared-name", {"owner": "mine"})
        agent.update(mine, "shared-name", "answer", "completed", result={"n": 1})
        assert loaded(agent, mine, "shared-name").state == {"owner": "mine"}
        with pytest.raises(TenantContextMismatch):
            agent.load(theirs, "shared-name")
        with pytest.raises(TenantContextMismatch):
            agent.update(theirs, "shared-name", "answer", "running")
