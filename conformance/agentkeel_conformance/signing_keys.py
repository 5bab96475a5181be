"""The token signing key the suite's first mint makes, removed when the run ends.

keel.mint_tenant_token creates a signing key when none is active. In a database with no
active key the suite's first mint therefore leaves a key behind, which the suite, which
removes what it made, must not. The controller (under xdist: after every worker has
finished) notes at the start whether an active key exists; if none did, it deletes at the
end every key created since the start. A token another program minted during the run
with such a key stops verifying: run the suite before the application mints its first
token, or once it has.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

from agentkeel_conformance.connections import suite_connect

STATE = (
    "select to_regclass('keel.tenant_token_keys') is null"
    " or not exists (select 1 from keel.tenant_token_keys where retired_at is null),"
    " clock_timestamp()"
)


class SigningKeyCleanup:
    """Registered on the controller when the suite tests a database it did not create."""

    def __init__(self, owner_dsn: str) -> None:
        self.owner_dsn = owner_dsn
        self.since: datetime | None = None  # set when no active key existed at the start
        self.problem: str | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        try:
            with suite_connect(self.owner_dsn, autocommit=True) as conn:
                row = conn.execute(STATE).fetchone()
        except psycopg.Error:
            return  # no owner rights: the fixtures that need them skip, with the reason
        if row is not None and row[0]:
            self.since = row[1]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.since is None:
            return
        try:
            with suite_connect(self.owner_dsn, autocommit=True) as conn:
                if conn.execute("select to_regclass('keel.tenant_token_keys')").fetchone() == (
                    None,
                ):
                    return
                conn.execute(
                    "delete from keel.tenant_token_keys where created_at >= %s", (self.since,)
                )
        except psycopg.Error as err:
            self.problem = (
                "the token signing key the suite's first mint created is left in "
                f"keel.tenant_token_keys: {str(err).strip().splitlines()[0]}"
            )

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.problem is not None:
            terminalreporter.write_line(f"agentkeel: warning: {self.problem}")
