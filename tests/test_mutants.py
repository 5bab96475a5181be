"""Generated mutants: every guard of the SQL API (`raise exception ...`) disabled in turn,
in a database of its own; the conformance suite must notice each one (exit 1). A mutant
the suite passes is a survivor: a guard no test checks.

On demand, since each runs the suite (up to a minute; 132 guards):

    AGENTKEEL_MUTANTS=all .venv/bin/pytest tests/test_mutants.py -n 2
    AGENTKEEL_MUTANTS='claim_*.sql' .venv/bin/pytest tests/test_mutants.py

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
        return [g for g in GUARDS if fnmatch.fnmatch(g.path.name, CHOICE)]
    return [g for g in GUARDS if g.path.name == "assert_lease.sql"][:1]


def test_every_guard_is_found():
    """Every SQLSTATE the functions raise is raised by a guard found here."""
    raised = {g.sqlstate for g in GUARDS}
    assert len(GUARDS) > 100 and None not in raised
    assert {"22K01", "42K06", "55K01", "55K03", "55K08"} <= raised
    for guard in GUARDS:
        text = disabled(guard)
        assert text.count("null;") > guard.path.read_text().count("null;")


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
