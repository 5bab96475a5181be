"""Every public function under hostile input (G2, G3, G5, G9): NUL bytes, 1 MB strings,
deep or huge jsonb, Unicode look-alikes, NULLs, infinite timestamps, integer edges. Only
documented SQLSTATEs or standard data errors come back, never an internal error. (Each
call runs in a transaction the fuzzer rolls back, so it claims nothing about writes: a
refused call writing nothing is PostgreSQL's atomicity, not a property to fuzz.)"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg import sql

from agentkeel.errors import ERRORS
from agentkeel_conformance.harness import in_tenant

pytestmark = pytest.mark.guarantee("G2", "G3", "G5", "G9")

# Documented: agentkeel's registry, data exceptions (class 22), check and unique
# violations, program limits (too deep), serialization failures (retry).
STANDARD = {"23514", "23505", "54000", "54001", "40001"}
FULLWIDTH = "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44"  # "password", full width


def allowed(sqlstate: str | None) -> bool:
    return sqlstate is not None and (
        sqlstate in ERRORS or sqlstate.startswith("22") or sqlstate in STANDARD
    )


class RawJson(str):
    """JSON text sent as is: nesting deeper than Python's json module can write."""

    __slots__ = ()

    def __repr__(self) -> str:  # keep hypothesis' report short
        return f"RawJson(<{len(self)} chars>)"


def deep(depth: int) -> RawJson:
    return RawJson('{"k": ' * depth + '"leaf"' + "}" * depth)


HOSTILE_TEXT = ["", " ", "a\x00b", "x" * 1_000_000, FULLWIDTH, "\u01c4", "\u202e", "'; drop --"]
texts = st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE_TEXT), st.none())
ints = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]),
    st.none(),
)
timestamps = st.one_of(st.sampled_from(["infinity", "-infinity", "epoch", "2100-01-01"]), st.none())
# Mixed units: interval comparison counts a month as 30 days and a year as 360, so these
# compare as small positive intervals but end years away, or before they start.
MIXED_INTERVALS = [
    "1000 years -359999 days",
    "-1000 years 360001 days",
    "1 mon -29 days",
    "-1 mon 31 days",
    "1 year -11 mons -29 days 23 hours",
    "178000000 years",
    "-178000000 years",
    "1 day -86399 seconds",
]
intervals = st.one_of(
    st.sampled_from(
        [timedelta(0), timedelta(seconds=-1), timedelta(days=36500), timedelta(microseconds=1)]
    ),
    st.sampled_from(MIXED_INTERVALS),
    st.builds(
        lambda y, m, d, s: f"{y} years {m} mons {d} days {s} seconds",
        st.integers(-2000, 2000),
        st.integers(-24000, 24000),
        st.integers(-800_000, 800_000),
        st.integers(-(10**9), 10**9),
    ),
    st.none(),
)
HOSTILE_JSON = [
    deep(300),
    deep(100_000),
    RawJson(json.dumps({"big": ["x" * 1000] * 2000})),
    RawJson('{"\\u0000": 1}'),
    RawJson('{"a": "\\u0000"}'),
    RawJson('{"password": {"nested": true}}'),
    RawJson('{"steps": [{"API-Key": "x"}]}'),
    RawJson('[{"topic": "t", "payload": {"token": "x"}}]'),
]
jsons = st.one_of(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    st.sampled_from(HOSTILE_JSON),
    st.none(),
)


blobs = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"\x00" * 12, b"\xff" * 2_000_000]),
    st.none(),
)


def ids(real: str) -> st.SearchStrategy[Any]:
    """Mostly the fixture's real id (to get deep into the function), else a random uuid or NULL."""
    return st.one_of(st.just(real), st.just(real), st.just(real), st.uuids(), st.none())


FUNCTIONS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "create_task": {
        "tenant_id": ids("tenant"),
        "workflow": st.one_of(st.just("wf"), texts),
        "workflow_version": ints,
        "task_id": st.one_of(st.uuids(), st.just("task"), st.none()),
        "wake_at": timestamps,
        "metadata": jsons,
        "actor": texts,
        "trace_id": texts,
        "span_id": texts,
    },
    "claim_lease": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "owner": texts,
        "lease": intervals,
    },
    "renew_lease": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "fencing_token": ints,
        "lease": intervals,
    },
    "release_lease": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "fencing_token": ints,
        "wake_at": timestamps,
    },
    "transition_task": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "expected_version": ints,
        "to_state": st.one_of(st.sampled_from(["running", "done"]), texts),
        "fencing_token": ints,
        "event_type": texts,
        "payload": jsons,
        "outbox": jsons,
        "actor": texts,
        "policy_version": texts,
        "current_step": texts,
        "release_lease": st.one_of(st.booleans(), st.none()),
        "wake_at": timestamps,
    },
    "reserve_operation": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "idempotency_key": texts,
        "action": texts,
        "input_hash": texts,
        "fencing_token": ints,
        "retention": intervals,
        "trace_id": texts,
        "span_id": texts,
    },
    "complete_operation": {
        "tenant_id": ids("tenant"),
        "operation_id": ids("operation"),
        "fencing_token": ints,
        "result": jsons,
        "provider_reference": texts,
    },
    "fail_operation": {
        "tenant_id": ids("tenant"),
        "operation_id": ids("operation"),
        "fencing_token": ints,
        "error": jsons,
        "retryable": st.one_of(st.booleans(), st.none()),
        "provider_reference": texts,
    },
    "define_workflow": {
        "workflow": texts,
        "workflow_version": ints,
        "initial_state": texts,
        "transitions": jsons,
        "description": texts,
    },
    "mint_tenant_token": {"tenant_id": ids("tenant"), "ttl": intervals, "login": texts},
    "claim_next_task": {"owner": texts, "lease": intervals, "workflow": texts},
    "get_task": {"tenant_id": ids("tenant"), "task_id": ids("task")},
    "list_tasks": {
        "tenant_id": ids("tenant"),
        "state": texts,
        "after_task_id": st.one_of(ids("task"), st.uuids()),
        "limit": ints,
    },
    "task_history": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "after_seq": ints,
        "limit": ints,
    },
    "get_operation": {"tenant_id": ids("tenant"), "operation_id": ids("operation")},
    "begin_step": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "step_key": st.one_of(st.just("fuzz-step"), texts),
        "input_hash": st.one_of(st.just("h"), texts),
        "fencing_token": st.one_of(st.just("token"), ints),
        "retention": intervals,
    },
    "complete_step": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "step_key": st.one_of(st.just("fuzz-step"), texts),
        "fencing_token": st.one_of(st.just("token"), ints),
        "result": jsons,
        "repairs": ints,
    },
    "fail_step": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "step_key": st.one_of(st.just("fuzz-step"), texts),
        "fencing_token": st.one_of(st.just("token"), ints),
        "error": jsons,
        "retryable": st.one_of(st.booleans(), st.none()),
        "retry_after": intervals,
        "repairs": ints,
    },
    "save_checkpoint": {
        "tenant_id": ids("tenant"),
        "task_id": ids("task"),
        "checkpoint_id": st.one_of(st.uuids(), st.none()),
        "fencing_token": st.one_of(st.just("token"), ints),
        "kind": st.one_of(st.sampled_from(["SYNTHESIS", "TOOL_RESULT"]), texts),
        "key_version": ints,
        "nonce": blobs,
        "ciphertext": blobs,
        "payload_hash": texts,
        "schema_version": ints,
        "step_key": texts,
        "ttl": intervals,
    },
    "latest_checkpoint": {"tenant_id": ids("tenant"), "task_id": ids("task"), "kind": texts},
    "add_tenant_data_key": {
        "tenant_id": ids("tenant"),
        "wrapped_key": blobs,
        "wrapping_key_id": texts,
    },
    "tenant_data_key": {"tenant_id": ids("tenant"), "key_version": ints},
}
# Functions only one trusted role may call (policies/03_privileges.sql); the rest are
# called as the --dsn role.
CALLER = {
    "claim_next_task": "keel_worker",
    "define_workflow": "keel_app",
    "mint_tenant_token": "keel_app",
}
JSON_PARAMS = {"metadata", "payload", "outbox", "result", "error", "transitions"}


def json_text(value: Any) -> str | None:
    if value is None or isinstance(value, RawJson):
        return value
    return json.dumps(value)


def signature(conn: psycopg.Connection, function: str) -> dict[str, str]:
    """Parameter name (without p_) -> declared type. Every argument is cast to it, so an
    out-of-range value fails as data (22003), as it would from any typed client."""
    rows = conn.execute(
        "select a.name, format_type(a.type, null) from pg_proc as p,"
        " unnest(p.proargnames[1:p.pronargs], p.proargtypes::oid[]) as a (name, type)"
        " where p.oid = %s::regproc",
        (f"keel.{function}",),
    ).fetchall()
    return {name.removeprefix("p_"): type_name for name, type_name in rows}


class _Rollback(Exception):
    """Undo a call that succeeded: the fuzzer looks only for errors it should not get."""


@pytest.fixture
def fuzz_world(keel, tenant, new_task):
    task = new_task()
    claimed = keel.claim_lease(tenant, task.task_id, "fuzzer", timedelta(hours=1))
    op = keel.reserve_operation(
        tenant, task.task_id, "fuzz", "x", "h", fencing_token=claimed.fencing_token
    )
    return {
        "tenant": tenant,
        "task": task.task_id,
        "operation": op.operation_id,
        "token": claimed.fencing_token,
    }


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_hostile_input_gets_only_documented_errors(
    function, fuzz_world, connect, workflow, on_citus, workflow_keel
):
    """On Citus a NULL tenant id is never sent to a function Citus delegates by it: Citus
    13.2 crashes the coordinator on a NULL distribution argument (docs/citus.md); the
    agentkeel client refuses it before sending.
    No mutation: randomised input: which planted bug it finds depends on the draw."""
    if function == "define_workflow" and on_citus:
        conn = workflow_keel.conn  # on Citus the owner's login defines workflows
    else:
        conn = connect(role=CALLER.get(function))
    real = {**fuzz_world, "wf": workflow.name}
    types = signature(conn, function)

    @settings(
        max_examples=100,
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        print_blob=True,
    )
    @given(args=st.fixed_dictionaries(FUNCTIONS[function]))
    def attack(args: dict[str, Any]) -> None:
        values = {k: real.get(v, v) if isinstance(v, str) else v for k, v in args.items()}
        values = {k: json_text(v) if k in JSON_PARAMS else v for k, v in values.items()}
        assume(not (on_citus and "tenant_id" in values and values["tenant_id"] is None))
        query = sql.SQL("select * from keel.{}({})").format(
            sql.Identifier(function),
            sql.SQL(", ").join(
                sql.SQL("{} => {}::{}").format(
                    sql.Identifier(f"p_{k}"), sql.Placeholder(), sql.SQL(types[k])
                )
                for k in values
            ),
        )
        try:
            with in_tenant(conn, real["tenant"]):
                conn.execute(query, list(values.values())).fetchall()
                raise _Rollback
        except _Rollback:
            return
        except psycopg.Error as err:
            if err.sqlstate is None and isinstance(err, psycopg.DataError):
                return  # refused by the driver before sending (a NUL byte): nothing sent
            assert allowed(err.sqlstate), f"{function}: undocumented {err.sqlstate}: {err}"

    attack()
