"""Deterministic interleavings with PostgreSQL isolation-tester semantics.

A spec names sessions, their steps and the permutations to run. Each session has its
own connection; steps are launched in the permutation's order; a step counts as blocked
when pg_isolation_test_session_is_blocked() (on Citus: citus_lock_waits) says so, polled
from a control connection, and the runner moves on to the next step. The transcript of
every permutation (each step's result, <waiting>, <completed>, or its SQLSTATE) is
compared with the spec's expected file, as PostgreSQL's own isolation tests do.

Spec grammar (specs/*.spec):

    # guarantee: G2            one or more ids, for the guarantee table
    setup { sql }              before each permutation, on the control connection
    session s1                 a keel_worker login; `session s2 as owner`: the owner's
    step s1_reserve { sql }    {tenant}, {task}, {task2}, {workflow} become literals
    permutation s1_a s2_a ...  (none: every interleaving that keeps each session's order)
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import permutations as all_orders
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from agentkeel.client import set_tenant_context
from agentkeel.errors import ERRORS
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import delete_tenant, inconclusive, suite_tenant

SPECS_DIR = Path(__file__).resolve().parent / "specs"
BLOCK_TIMEOUT = 30.0


def is_citus(control: psycopg.Connection) -> bool:
    """Whether the database is a Citus coordinator."""
    row = control.execute("select to_regclass('pg_catalog.citus_lock_waits')").fetchone()
    return bool(row and row[0])


def blocked_query(citus: bool) -> str:
    """Is session pid %s waiting for one of the pids %s? On Citus a step's lock wait
    happens on the worker that holds its tenant, as the worker's part of the session's
    distributed transaction: citus_lock_waits (every node's waits, by global pid) shows
    it where pg_isolation_test_session_is_blocked, which sees this node only, cannot."""
    if not citus:
        return "select pg_isolation_test_session_is_blocked(%s, %s)"
    return (
        "select exists (select 1 from pg_catalog.citus_lock_waits as w"
        " where pg_catalog.citus_pid_for_gpid(w.waiting_gpid) = %s"
        " and pg_catalog.citus_pid_for_gpid(w.blocking_gpid) = any(%s))"
    )


def wait_until_blocked(
    control: psycopg.Connection,
    waiter: psycopg.Connection,
    holders: Sequence[psycopg.Connection],
    call: Future[Any],
    what: str,
    timeout: float = 120.0,
) -> None:
    """Wait until the session of waiter waits for a lock one of holders holds, as a test's
    interleaving needs, polled from control. A call that finished first returns here: the
    test's assertions judge what it did. No wait seen while it still runs means this
    database did not let the wait be seen: the experiment could not be set up
    (inconclusive), which says nothing of the guarantee."""
    query = blocked_query(is_citus(control))
    pids = (waiter.info.backend_pid, [h.info.backend_pid for h in holders])
    deadline = time.monotonic() + timeout
    while not call.done():
        row = control.execute(query, pids).fetchone()
        if row and row[0]:
            return
        if time.monotonic() > deadline:
            inconclusive(f"{what}: no lock wait was seen in {timeout:g}s")
        time.sleep(0.005)


class SpecError(ValueError):
    """The spec text does not follow the grammar."""


@dataclass(frozen=True)
class Step:
    name: str
    session: str
    sql: str


@dataclass
class Spec:
    name: str
    guarantees: list[str]
    setup: list[str] = field(default_factory=list)
    sessions: dict[str, list[Step]] = field(default_factory=dict)
    owner_sessions: set[str] = field(default_factory=set)  # `session <name> as owner`
    permutations: list[list[str]] = field(default_factory=list)

    @property
    def steps(self) -> dict[str, Step]:
        return {s.name: s for steps in self.sessions.values() for s in steps}

    def all_permutations(self) -> list[list[str]]:
        """The listed permutations, or every interleaving that keeps each session's order."""
        if self.permutations:
            return self.permutations
        names = [s.name for steps in self.sessions.values() for s in steps]
        order = {s.name: i for steps in self.sessions.values() for i, s in enumerate(steps)}
        session_of = {s.name: s.session for steps in self.sessions.values() for s in steps}
        result = []
        for candidate in all_orders(names):
            seen: dict[str, int] = {}
            ok = True
            for name in candidate:
                if order[name] != seen.get(session_of[name], 0):
                    ok = False
                    break
                seen[session_of[name]] = order[name] + 1
            if ok:
                result.append(list(candidate))
        return result


def _block(text: str, start: int) -> tuple[str, int]:
    """The text between the brace at text[start] and its match (quotes respected)."""
    if text[start] != "{":
        raise SpecError(f"expected '{{' at offset {start}")
    depth, i, quoted = 0, start, False
    while i < len(text):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "{":
            depth += 1
        elif not quoted and ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i].strip(), i + 1
        i += 1
    raise SpecError("unbalanced braces")


def parse_spec(text: str, name: str = "spec") -> Spec:
    guarantees = re.findall(r"^#\s*guarantee:\s*(.+)$", text, flags=re.MULTILINE)
    spec = Spec(name=name, guarantees=[g.strip() for line in guarantees for g in line.split(",")])
    body = re.sub(r"^#.*$", "", text, flags=re.MULTILINE)
    pos, session = 0, None
    token = re.compile(r"\s*(setup|session|step|permutation)\b\s*")
    while pos < len(body):
        if not body[pos:].strip():
            break
        match = token.match(body, pos)
        if not match:
            raise SpecError(f"{name}: unexpected text: {body[pos : pos + 40].strip()!r}")
        keyword, pos = match[1], match.end()
        if keyword == "setup":
            block, pos = _block(body, pos)
            spec.setup.append(block)
        elif keyword == "session":
            ident = re.match(r"(\w+)\s*", body[pos:])
            if not ident:
                raise SpecError(f"{name}: session needs a name")
            session, pos = ident[1], pos + ident.end()
            spec.sessions[session] = []
            as_owner = re.match(r"as\s+owner\b\s*", body[pos:])
            if as_owner:
                spec.owner_sessions.add(session)
                pos += as_owner.end()
        elif keyword == "step":
            ident = re.match(r"(\w+)\s*", body[pos:])
            if not ident or session is None:
                raise SpecError(f"{name}: a step needs a name, inside a session")
            pos += ident.end()
            block, pos = _block(body, pos)
            spec.sessions[session].append(Step(ident[1], session, block))
        else:
            line_end = body.find("\n", pos)
            line_end = len(body) if line_end < 0 else line_end
            spec.permutations.append(body[pos:line_end].split())
            pos = line_end
    known = spec.steps
    for perm in spec.permutations:
        for step_name in perm:
            if step_name not in known:
                raise SpecError(f"{name}: permutation names unknown step {step_name}")
    if len(spec.sessions) < 2:
        raise SpecError(f"{name}: a spec needs at least two sessions")
    return spec


def load_specs() -> list[Spec]:
    return [parse_spec(p.read_text(), p.stem) for p in sorted(SPECS_DIR.glob("*.spec"))]


def expected_output(spec: Spec) -> str | None:
    path = SPECS_DIR / "expected" / f"{spec.name}.out"
    return path.read_text() if path.exists() else None


def _render(text: str, values: dict[str, Any]) -> bytes:
    literals = {k: sql.Literal(v).as_string(None) for k, v in values.items()}
    return re.sub(r"\{(\w+)\}", lambda m: literals[m[1]], text).encode()


def _describe(cur: psycopg.Cursor[Any]) -> str:
    """The last result of the step that returned rows, else ok."""
    rows = None
    while True:
        if cur.description is not None:
            rows = cur.fetchall()
        if not cur.nextset():
            break
    if rows is None:
        return "ok"
    if not rows:
        return "(no rows)"
    return ", ".join("|".join("null" if v is None else str(v) for v in row) for row in rows)


def _describe_error(err: psycopg.Error) -> str:
    cls = ERRORS.get(err.sqlstate or "")
    return f"ERROR {err.sqlstate}" + (f" {cls.name}" if cls else "")


class _Running:
    """One step executing on its session's connection in a thread."""

    def __init__(
        self, step: Step, conn: psycopg.Connection, query: bytes, tenant: uuid.UUID
    ) -> None:
        self.step = step
        self.outcome: str | None = None
        self.thread = threading.Thread(target=self._run, args=(conn, query, tenant), daemon=True)
        self.thread.start()

    def _run(self, conn: psycopg.Connection, query: bytes, tenant: uuid.UUID) -> None:
        # The tenant context is set inside each step's transaction (SET LOCAL), as the API
        # requires: a step that opens a transaction block (begin) sets it right after; any
        # other step outside a block runs in a transaction of its own that sets it first.
        opens = re.match(rb"\s*(begin|start\s+transaction)\b", query, re.IGNORECASE) is not None
        own = not opens and conn.info.transaction_status == TransactionStatus.IDLE
        try:
            with conn.cursor() as cur:
                if own:
                    cur.execute("begin")
                    set_tenant_context(conn, tenant)
                cur.execute(query)
                if opens:
                    set_tenant_context(conn, tenant)
                outcome = _describe(cur)
                if own:
                    cur.execute("commit")
            self.outcome = outcome
        except psycopg.Error as err:
            if own and conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("rollback")
            self.outcome = _describe_error(err)

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


class Runner:
    """Runs a spec's permutations against a database; fresh tenant and task per permutation."""

    def __init__(
        self,
        dsn: str,
        workflow: str,
        options: str = "",
        owner_dsn: str | None = None,
        control_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn  # the sessions'
        self.workflow = workflow
        self.options = options
        self.owner_dsn = owner_dsn or dsn
        self.control_dsn = control_dsn or dsn  # creates the tenant, runs setup, watches locks
        self._citus: bool | None = None  # the database is a Citus coordinator (asked once)

    def _connect(self, dsn: str | None = None) -> psycopg.Connection:
        return suite_connect(dsn or self.dsn, autocommit=True, options=self.options)

    def run(self, spec: Spec) -> str:
        return "".join(self.run_permutation(spec, perm) for perm in spec.all_permutations())

    def run_permutation(self, spec: Spec, perm: list[str]) -> str:
        tenant = suite_tenant(uuid.uuid4())  # listed before it exists (harness.LIVE_TENANTS)
        values: dict[str, Any] = {
            "tenant": tenant,
            "task": uuid.uuid4(),
            "task2": uuid.uuid4(),
            "workflow": self.workflow,
        }
        lines = [f"starting permutation: {' '.join(perm)}"]
        control = self._connect(self.control_dsn)
        conns = {
            name: self._connect(self.owner_dsn if name in spec.owner_sessions else None)
            for name in spec.sessions
        }
        waiting: list[_Running] = []
        try:
            with control.transaction():
                set_tenant_context(control, values["tenant"])
                control.execute(
                    "select keel.create_tenant(%s, 'agentkeel-conformance-interleave')",
                    (values["tenant"],),
                )
                for block in spec.setup:
                    control.execute(_render(block, values))
            pids = {name: c.info.backend_pid for name, c in conns.items()}
            steps = spec.steps
            for name in perm:
                step = steps[name]
                if any(w.step.session == step.session for w in waiting):
                    raise SpecError(f"{spec.name}: {name} runs while its session is blocked")
                running = _Running(step, conns[step.session], _render(step.sql, values), tenant)
                if self._settle(control, running, pids):
                    lines.append(f"step {name}: {running.outcome}")
                else:
                    lines.append(f"step {name}: <waiting>")
                    waiting.append(running)
                for other in list(waiting):
                    if other is running:
                        continue
                    if self._settle(control, other, pids):
                        lines.append(f"step {other.step.name}: <completed> {other.outcome}")
                        waiting.remove(other)
            for other in waiting:
                lines.append(f"step {other.step.name}: <never completed>")
            return "\n".join(lines) + "\n\n"
        finally:
            for w in waiting:  # a spec that leaves a step blocked: cancel it, then clean up
                control.execute(
                    "select pg_cancel_backend(%s)", (conns[w.step.session].info.backend_pid,)
                )
                w.thread.join(5)
            for c in conns.values():
                c.close()
            control.close()
            with suite_connect(self.owner_dsn, autocommit=True, options=self.options) as owner:
                delete_tenant(owner, values["tenant"])

    def _blocked_query(self, control: psycopg.Connection) -> str:
        if self._citus is None:
            self._citus = is_citus(control)
        return blocked_query(self._citus)

    def _settle(self, control: psycopg.Connection, running: _Running, pids: dict[str, int]) -> bool:
        """Wait until the step completes (True) or is blocked by another session (False)."""
        me = pids[running.step.session]
        others = [pid for name, pid in pids.items() if name != running.step.session]
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while time.monotonic() < deadline:
            if running.done:
                running.thread.join()
                return True
            row = control.execute(self._blocked_query(control), (me, others)).fetchone()
            if row and row[0]:
                # Blocked by another session now. A lock that session released has already
                # woken this one (the releaser grants it before its commit returns), so a
                # wait seen here is a wait on a lock still held.
                if running.done:
                    running.thread.join()
                    return True
                return False
            time.sleep(0.005)
        raise TimeoutError(
            f"step {running.step.name} neither finished nor blocked in {BLOCK_TIMEOUT}s"
        )
