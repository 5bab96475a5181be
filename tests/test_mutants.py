"""Generated mutants: every guard of the SQL API disabled in turn (each `raise exception`,
and each call of a guard function such as `perform keel.require_tenant(...)`), in a
database of its own; the conformance suite must notice each one (exit 1). A mutant the
suite passes is a survivor: a guard no test checks.

On demand, since each runs the suite (seconds when it is noticed, about a minute for a
survivor; 194 guards):

    AGENTKEEL_MUTANTS=all .venv/bin/pytest tests/test_mutants.py -n 2
    AGENTKEEL_MUTANTS='claim_*.sql,require_tenant.sql' .venv/bin/pytest tests/test_mutants.py

the failures are the survivors, each named file:line SQLSTATE. Without the variable, one
mutant runs (the fencing check of assert_lease), so the machinery itself stays tested.
"""

from __future__ import annotations

import fnmatch
import os

import psycopg
import pytest

from agentkeel_conformance.mutations import Guard, disabled, guards
from conftest import REPO, run_agentkeel

GUARDS = [g for path in sorted((REPO / "functions").glob("*.sql")) for g in guards(path)]
CHOICE = os.environ.get("AGENTKEEL_MUTANTS", "")


def selected() -> list[Guard]:
    if CHOICE == "all":
        return GUARDS
    if CHOICE:
        patterns = [p.strip() for p in CHOICE.split(",") if p.strip()]
        return [g for g in GUARDS if any(fnmatch.fnmatch(g.path.name, p) for p in patterns)]
    return [g for g in GUARDS if g.path.name == "assert_lease.sql"][:1]


def test_every_guard_is_found():
    """Every raise names its SQLSTATE; the calls of every guard function are found."""
    raises = [g for g in GUARDS if g.calls is None]
    assert len(raises) > 100 and all(g.sqlstate for g in raises)
    assert {"22K01", "42K06", "55K01", "55K03", "55K08"} <= {g.sqlstate for g in raises}
    called = {g.calls for g in GUARDS if g.calls}
    assert {"require_tenant", "assert_lease", "check_payload", "refuse_acting_for_none"} <= called
    for guard in GUARDS:
        assert disabled(guard).count("null;") == guard.text.count("null;") + 1


@pytest.mark.parametrize("guard", selected(), ids=lambda g: g.name)
def test_the_suite_notices_a_disabled_guard(migrated_db, guard):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(disabled(guard).encode())
    # -x: the first failing test decides (serially: under xdist -x reads as interrupted)
    result = run_agentkeel("conformance", "--dsn", migrated_db, "-q", "-x", timeout=900)
    assert result.returncode == 1, (
        f"survived: {guard.name} (line {guard.line} of {guard.path.name}) disabled, and the "
        "whole suite passed: no test checks this guard"
    )
    assert "FAILED" in result.stdout, result.stdout[-3000:]
