"""The catalog posture of the database (`agentkeel check`'s rules), as tests: what
`--read-only` runs, writing nothing."""

from __future__ import annotations

import psycopg
import pytest

from agentkeel.check import rule_files, rule_guarantee, rule_unmet, run_rule

pytestmark = pytest.mark.read_only


# Each rule file names the guarantee it checks (`'G4' as guarantee`); no default.
@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(p, id=p.stem, marks=pytest.mark.guarantee(rule_guarantee(p)))
        for p in rule_files()
    ],
)
def test_catalog_rule(keel_dsn, rule):
    """No mutation: each case is one agentkeel check rule, a catalog query run directly."""
    with psycopg.connect(keel_dsn, autocommit=True) as conn:
        unmet = rule_unmet(conn, rule)
        if unmet is not None:
            pytest.skip(f"{rule.stem}: {unmet[1]}")
        findings = run_rule(conn, rule)
    failing = [f for f in findings if f.level == "error"]
    assert not failing, "\n".join(f"{f.object}: {f.problem} (remedy: {f.remedy})" for f in failing)
