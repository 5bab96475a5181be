"""The conformance suite through PgBouncer in transaction mode, with a default configuration:
no ``options`` startup parameter (timeouts are SET after connecting), prepared statements
off (``--no-prepare``), and the suite's temporary login roles found by ``auth_query``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import conninfo

from conftest import run_agentkeel
from pgbouncer import PgBouncer, PgBouncerNotFound

# Need what a transaction pooler cannot give: the real backend pid of a session
# (pg_isolation_test_session_is_blocked, pg_terminate_backend) or the embedded cluster.
NOT_THROUGH_A_POOLER = "not interleaving and not race and not chaos"


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


def test_the_suite_passes_through_pgbouncer(migrated_db, strict_pgbouncer):
    pooled = strict_pgbouncer.dsn_for(migrated_db)
    result = run_agentkeel(
        "conformance",
        "--dsn",
        pooled,
        "--no-prepare",
        "-q",
        "-n",
        "2",
        "-m",
        "not chaos",
        "-k",
        NOT_THROUGH_A_POOLER,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
