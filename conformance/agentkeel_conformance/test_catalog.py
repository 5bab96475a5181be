"""The catalog posture of the database (`agentkeel check`'s rules), as tests: what
`--read-only` runs, writing nothing."""

from __future__ import annotations

import psycopg
import pytest

from agentkeel.check import rule_files, run_rule

pytestmark = pytest.mark.read_only

GUARANTEE_OF_RULE = {
    "rls_forced": "G1",
    "tenant_keys": "G1",
    "application_roles": "G1",
    "security_definer": "G1",
    "views_security_invoker": "G1",
    "events_append_only": "G4",
    "role_timeouts": "G7",
}


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(p, id=p.stem, marks=pytest.mark.guarantee(GUARANTEE_OF_RULE.get(p.stem, "G1")))
        for p in rule_files()
    ],
)
def test_catalog_rule(keel_dsn, rule):
    with psycopg.connect(keel_dsn, autocommit=True) as conn:
        findings = run_rule(conn, rule)
    assert not findings, "\n".join(
        f"{f.object}: {f.problem} (remedy: {f.remedy})" for f in findings
    )
