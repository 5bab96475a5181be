"""A hypothesis state machine of the task and operation lifecycle against the real database,
compared with a model in Python after every step (G2, G3, G5). A fresh tenant per example;
derandomized when CI is set."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from agentkeel.client import Keel
from agentkeel.errors import (
    IdempotencyConflict,
    IllegalTransition,
    KeelError,
    LeaseHeld,
    LeaseLost,
    OperationNotReserved,
    StaleState,
    TaskNotClaimable,
)
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.fixtures import EDGES, TENANT_PREFIX
from agentkeel_conformance.harness import delete_tenant, suite_tenant

pytestmark = pytest.mark.guarantee("G2", "G3", "G5")

LEASE = timedelta(hours=1)  # never expires within an example: expiry is the race tests' job
STATES = sorted({s for edge in EDGES for s in edge})
TERMINAL = {s for s in STATES if not any(a == s for a, _ in EDGES)}
KEYS = ["k1", "k2", "k3"]
HASHES = ["h1", "h2"]


@dataclass
class ModelTask:
    state: str = "queued"
    version: int = 1
    token: int = 0
    leased: bool = False
    events: int = 1


@dataclass
class ModelOperation:
    task: uuid.UUID | None
    input_hash: str
    state: str = "reserved"
    attempts: int = 1
    result: dict[str, int] | None = None


@dataclass
class Model:
    tasks: dict[uuid.UUID, ModelTask] = field(default_factory=dict)
    operations: dict[str, ModelOperation] = field(default_factory=dict)


def machine(dsn: str, owner_dsn: str, workflow: str) -> type[RuleBasedStateMachine]:
    class TaskLifecycle(RuleBasedStateMachine):
        tasks = Bundle("tasks")

        def __init__(self) -> None:
            super().__init__()
            self.conn = suite_connect(dsn, autocommit=True)
            self.keel = Keel(self.conn)
            self.tenant = suite_tenant(uuid.uuid4())  # listed before it exists
            self.keel.create_tenant(f"{TENANT_PREFIX}model", self.tenant)
            self.model = Model()

        def teardown(self) -> None:
            self.conn.close()
            with suite_connect(owner_dsn, autocommit=True) as owner:
                delete_tenant(owner, self.tenant)

        def expect(self, error: type[KeelError] | None, call) -> object:
            if error is None:
                return call()
            with pytest.raises(error):
                call()
            return None

        @rule(target=tasks)
        def create(self) -> uuid.UUID:
            task = self.keel.create_task(self.tenant, workflow, 1)
            self.model.tasks[task.task_id] = ModelTask()
            return task.task_id

        @rule(task=tasks)
        def claim(self, task: uuid.UUID) -> None:
            m = self.model.tasks[task]
            error = TaskNotClaimable if m.state in TERMINAL else LeaseHeld if m.leased else None
            got = self.expect(error, lambda: self.keel.claim_lease(self.tenant, task, "w", LEASE))
            if got is not None:
                m.token += 1
                m.leased = True

        @rule(task=tasks, stale=st.booleans())
        def release(self, task: uuid.UUID, stale: bool) -> None:
            m = self.model.tasks[task]
            token = m.token - 1 if stale else m.token
            error = None if m.leased and not stale else LeaseLost
            if self.expect(error, lambda: self.keel.release_lease(self.tenant, task, token)):
                m.leased = False

        @rule(
            task=tasks,
            to_state=st.sampled_from(STATES),
            version_lag=st.sampled_from([0, 0, 1]),
            with_token=st.booleans(),
        )
        def transition(
            self, task: uuid.UUID, to_state: str, version_lag: int, with_token: bool
        ) -> None:
            m = self.model.tasks[task]
            token = m.token if with_token else None
            # The order transition_task checks in: fencing, then version, then the edge.
            if (with_token or m.leased) and not (m.leased and with_token):
                error: type[KeelError] | None = LeaseLost
            elif version_lag:
                error = StaleState
            elif (m.state, to_state) not in EDGES:
                error = IllegalTransition
            else:
                error = None
            moved = self.expect(
                error,
                lambda: self.keel.transition_task(
                    self.tenant,
                    task,
                    m.version - version_lag,
                    to_state,
                    fencing_token=token,
                    outbox=[{"topic": "model"}],
                ),
            )
            if moved is not None:
                m.state, m.version, m.events = to_state, m.version + 1, m.events + 1
                if to_state in TERMINAL:
                    m.leased = False

        @rule(key=st.sampled_from(KEYS), input_hash=st.sampled_from(HASHES))
        def reserve(self, key: str, input_hash: str) -> None:
            op = self.model.operations.get(key)
            error = IdempotencyConflict if op is not None and op.input_hash != input_hash else None
            got = self.expect(
                error,
                lambda: self.keel.reserve_operation(self.tenant, None, key, "act", input_hash),
            )
            if got is None:
                return
            if op is None:
                self.model.operations[key] = ModelOperation(None, input_hash)
                expected = "reserved"
            elif op.state == "retryable":
                op.state, op.attempts = "reserved", op.attempts + 1
                expected = "reserved"
            else:
                expected = "in_progress" if op.state == "reserved" else op.state
            assert got.outcome == expected  # type: ignore[attr-defined]

        @rule(
            key=st.sampled_from(KEYS),
            how=st.sampled_from(["succeeded", "failed", "retryable"]),
            n=st.integers(0, 9),
        )
        def finish(self, key: str, how: str, n: int) -> None:
            op = self.model.operations.get(key)
            if op is None:
                return
            with self.keel.transaction(self.tenant) as c:
                row = c.execute(
                    "select operation_id from keel.operations"
                    " where tenant_id = %s and idempotency_key = %s",
                    (self.tenant, key),
                ).fetchone()
                assert row is not None
                op_id = row[0]
            error = None if op.state == "reserved" else OperationNotReserved
            if how == "succeeded":
                call = lambda: self.keel.complete_operation(self.tenant, op_id, None, {"n": n})  # noqa: E731
            else:
                call = lambda: self.keel.fail_operation(  # noqa: E731
                    self.tenant, op_id, None, {"n": n}, retryable=how == "retryable"
                )
            if self.expect(error, call) is not None:
                op.state = how
                op.result = {"n": n} if how == "succeeded" else None

        @invariant()
        def database_matches_model(self) -> None:
            with self.keel.transaction(self.tenant) as c:
                rows = c.execute(
                    "select task_id, state, state_version, fencing_token, lease_owner is not null,"
                    " last_event_seq, (select count(*) from keel.task_events e"
                    "  where e.tenant_id = t.tenant_id and e.task_id = t.task_id)"
                    " from keel.tasks t where t.tenant_id = %s",
                    (self.tenant,),
                ).fetchall()
                ops = c.execute(
                    "select idempotency_key, input_hash, state, attempts, result"
                    " from keel.operations where tenant_id = %s",
                    (self.tenant,),
                ).fetchall()
            actual = {r[0]: (r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows}
            expected = {
                t: (m.state, m.version, m.token, m.leased, m.events, m.events)
                for t, m in self.model.tasks.items()
            }
            assert actual == expected
            assert {o[0]: o[1:] for o in ops} == {
                k: (o.input_hash, o.state, o.attempts, o.result)
                for k, o in self.model.operations.items()
            }

    return TaskLifecycle


def test_the_lifecycle_matches_the_model(role_dsn, owner_dsn, workflow, live_tenants):
    """No mutation: randomised model run: which planted bug it finds depends on the draw."""
    run_state_machine_as_test(
        machine(role_dsn("keel_app"), owner_dsn, workflow.name),
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,  # leave no .hypothesis folder in the caller's directory
            suppress_health_check=[HealthCheck.too_slow],
            print_blob=True,  # a failure prints the @reproduce_failure line
        ),
    )
