"""The conformance suite through PgBouncer in transaction mode, with a default configuration:
no ``options`` startup parameter (timeouts are SET after connecting), prepared statements
off (``--no-prepare``), and the suite's temporary login roles found by ``auth_query``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import conninfo

from agentkeel_conformance.fixtures import THROUGH_A_POOLER
from conftest import run_agentkeel
from pgbouncer import PgBouncer, PgBouncerNotFound


@pytest.fixture
def strict_pgbouncer(migrated_db: str) -> Iterator[PgBouncer]:
    params = conninfo.conninfo_to_dict(migrated_db)
    try:
        bouncer = PgBouncer(
            str(params.get("host") or "127.0.0.1"),
            int(str(params.get("port") or 5432)),
            ignore_options=False,
        ).start()
    except PgBouncerNotFound as err:
        pytest.skip(str(err))
    try:
        yield bouncer
    finally:
        bouncer.cleanup()


def failures_first(stdout: str) -> str:
    """What failed, and how, ahead of the long list of skips (a report of the tail alone
    showed the skips and cut off which test had failed)."""
    start = stdout.find("= FAILURES =")
    failed = [line for line in stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    report = stdout[start : start + 8000] if start >= 0 else stdout[-6000:]
    return "\n".join(failed) + "\n" + report


def test_the_suite_passes_through_pgbouncer(migrated_db, strict_pgbouncer):
    pooled = strict_pgbouncer.dsn_for(migrated_db)
    result = run_agentkeel(
        "conformance",
        "--dsn",
        pooled,
        "--no-prepare",
        "-q",
        "-rfEs",
        "-n",
        "2",
        timeout=900,
    )
    assert result.returncode == 0, failures_first(result.stdout) + result.stderr[-2000:]
    assert " passed" in result.stdout
    # The whole suite, selected by nobody: what needs each session's own backend (the
    # interleavings, the racing workers, a backend terminated mid-transition) skips,
    # saying why, instead of failing as a guarantee.
    pooled_skips = [line for line in result.stdout.splitlines() if THROUGH_A_POOLER in line]
    for needs_a_backend in ("test_interleavings.py", "test_race.py", "test_chaos.py"):
        assert any(needs_a_backend in line for line in pooled_skips), result.stdout[-6000:]
