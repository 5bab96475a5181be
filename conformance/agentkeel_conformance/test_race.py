"""Racing worker processes and a history checker (G2, G3, G5, G6): at most one effect per
idempotency key, never two valid leases at once, every accepted write carried the current
token, versions contiguous, every committed outbox message present exactly once."""

from __future__ import annotations

import json

import pytest

from agentkeel_conformance.connections import CONNECTION_OPTIONS
from agentkeel_conformance.race import RaceConfig, run_race

pytestmark = pytest.mark.guarantee("G2", "G3", "G5", "G6")


def test_racing_workers_keep_every_guarantee(
    direct_connection, role_dsn, workflow, tenant, tmp_path, artifacts
):
    """Mutation: outbox_dropped."""
    config = RaceConfig(role_dsn("keel_worker"), workflow.name, tenant, options=CONNECTION_OPTIONS)
    verdict, events = run_race(config, tmp_path)
    if not verdict.ok:
        path = artifacts(
            "race-history.jsonl", "".join(json.dumps(e, default=str) + "\n" for e in events)
        )
        pytest.fail(
            f"{len(verdict.violations)} violation(s); history in {path}:\n"
            + "\n".join(verdict.violations[:20])
        )
    assert verdict.counts["committed"] > 20, verdict.counts  # the race really ran
