"""Deterministic interleavings (isolation-tester semantics): every permutation of every
spec in specs/ must produce exactly its expected transcript in specs/expected/."""

from __future__ import annotations

import difflib

import pytest

from agentkeel_conformance.connections import CONNECTION_OPTIONS
from agentkeel_conformance.interleave import Runner, expected_output, load_specs

SPECS = load_specs()


@pytest.mark.parametrize(
    "spec",
    [pytest.param(s, id=s.name, marks=[pytest.mark.guarantee(*s.guarantees)]) for s in SPECS],
)
def test_interleaving(
    spec, direct_connection, role_dsn, owner_dsn, workflow, artifacts, live_tenants
):
    """Every spec's transcript; the mutations are caught by transition_same_version.spec
    and checkpoint_bytes_vs_second_save.spec.
    Mutation: version_unchecked; also usage_from_snapshot"""
    expected = expected_output(spec)
    assert expected is not None, f"specs/expected/{spec.name}.out is missing"
    # Sessions claim across tenants (keel_worker); the control connection makes the
    # permutation's tenant (keel_app).
    runner = Runner(
        role_dsn("keel_worker"),
        workflow.name,
        CONNECTION_OPTIONS,
        owner_dsn,
        control_dsn=role_dsn("keel_app"),
    )
    actual = runner.run(spec)
    if actual != expected:
        artifact = artifacts(f"interleaving-{spec.name}.out", actual)
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), actual.splitlines(True), "expected", "actual"
            )
        )
        pytest.fail(f"a permutation's outcome differs (transcript: {artifact}):\n{diff}")
