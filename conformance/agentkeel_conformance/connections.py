"""How the suite connects: timeouts set after connecting, prepared statements optional.

A connection pooler such as PgBouncer refuses (or, configured to, drops) the ``options``
startup parameter, so the timeouts every test connection carries are sent as SET
statements once connected. Through a transaction pooler (detected: its cancel key is not
the backend's pid) they are not sent at all: a session-level SET would stay on the pooled
server connection and reach the pool's next client (the login role's own settings, which
G7 checks, among them). There the timeouts come from the login roles or the pooler.

``--no-prepare`` (suite_options.py) connects with ``prepare_threshold=None``: psycopg
otherwise prepares statements run often, which a transaction pooler before PgBouncer 1.21
(or without ``max_prepared_statements``) cannot follow from one server connection to the
next. The plugin passes the switch on in $AGENTKEEL_NO_PREPARE, so that worker processes
see it too.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import psycopg

from agentkeel.pooler import is_pooled

# Every test connection carries these, so a hung test fails instead of hanging CI.
CONNECTION_OPTIONS = (
    "-c statement_timeout=30000 -c lock_timeout=10000 -c idle_in_transaction_session_timeout=60000"
)
NO_PREPARE_ENV = "AGENTKEEL_NO_PREPARE"


def settings(options: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of an ``-c name=value ...`` options string."""
    words = shlex.split(options)
    pairs = []
    for flag, assignment in zip(words[::2], words[1::2], strict=True):
        if flag != "-c" or "=" not in assignment:
            raise ValueError(f"not an -c name=value setting: {flag} {assignment}")
        name, value = assignment.split("=", 1)
        pairs.append((name, value))
    return pairs


def suite_connect(dsn: str, options: str = CONNECTION_OPTIONS, **kwargs: Any) -> psycopg.Connection:
    """psycopg.connect for the suite: ``options`` are SET after connecting, not sent at startup."""
    if os.environ.get(NO_PREPARE_ENV):
        kwargs.setdefault("prepare_threshold", None)
    conn = psycopg.connect(dsn, **kwargs)
    pairs = settings(options)
    if pairs and not is_pooled(conn):
        query = "select " + ", ".join("pg_catalog.set_config(%s, %s, false)" for _ in pairs)
        conn.execute(query.encode(), [v for pair in pairs for v in pair])
    if not conn.autocommit:
        conn.commit()
    return conn
