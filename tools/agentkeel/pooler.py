"""Is a connection pooler (PgBouncer, ...) between this connection and PostgreSQL?"""

from __future__ import annotations

import psycopg


def is_pooled(conn: psycopg.Connection) -> bool:
    """True when a pooler stands between us and PostgreSQL.

    A pooler answers the startup itself and hands out its own cancel key (BackendKeyData),
    so the pid libpq was given is not the pid of the backend that runs our queries.
    Port mappings, NAT and TCP proxies do not change the protocol, so they are not mistaken
    for a pooler. Runs one statement (in the connection's transaction, if one is open).
    """
    row = conn.execute("select pg_catalog.pg_backend_pid()").fetchone()
    return row is None or row[0] != conn.info.backend_pid
