"""`agentkeel watchdog`: limits the database enforces from outside an agent's session.

An agent (or worker) login may lift its own statement_timeout and friends, for a session
(SET) or for good (ALTER ROLE on itself). keel.watchdog ends its backends past the caps
in keel.settings anyway, and touches nobody else's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.exitcodes import ExitCode
from conftest import run_agentkeel, temporary_login

CAPS = {
    "agent_max_statement_seconds": "1",
    "agent_max_transaction_seconds": "3",
    "agent_max_idle_in_transaction_seconds": "1",
    "worker_max_statement_seconds": "1",
    "worker_max_transaction_seconds": "3",
    "worker_max_idle_in_transaction_seconds": "1",
}
DEADLINE = 120  # seconds: waiting on a condition, not measuring speed


@pytest.fixture
def short_caps(migrated_db: str) -> str:
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        for setting, value in CAPS.items():
            conn.execute("update keel.settings set value = %s where setting = %s", (value, setting))
    return migrated_db


@pytest.fixture
def watchdog_dsn(migrated_db: str) -> Iterator[str]:
    with temporary_login(migrated_db, "keel_watchdog") as dsn:
        user = conninfo.conninfo_to_dict(dsn)["user"]
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(
                sql.SQL("grant pg_read_all_stats, pg_signal_backend to {}").format(
                    sql.Identifier(str(user))
                )
            )
        yield dsn


def lifted(dsn: str) -> psycopg.Connection:
    """A session that lifted every limit it could, for itself and for its login."""
    conn = psycopg.connect(dsn, autocommit=True)
    for setting in ("statement_timeout", "idle_in_transaction_session_timeout", "lock_timeout"):
        conn.execute(sql.SQL("set {} = 0").format(sql.Identifier(setting)))
        conn.execute(
            sql.SQL("alter role {} set {} = 0").format(
                sql.Identifier(conn.info.user), sql.Identifier(setting)
            )
        )
    return conn


def alive(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select count(*) from pg_stat_activity where pid = %s", (pid,))
        return row.fetchone() == (1,)


def watch_until(dsn: str, pids: set[int], *args: str) -> list[dict[str, object]]:
    """Run `agentkeel watchdog --format json` until it has reported every pid in pids."""
    seen: dict[int, dict[str, object]] = {}
    deadline = time.monotonic() + DEADLINE
    while not pids <= seen.keys():
        assert time.monotonic() < deadline, f"the watchdog never reported {pids - seen.keys()}"
        result = run_agentkeel("watchdog", "--dsn", dsn, "--format", "json", *args)
        assert result.returncode == 0, result.stderr
        for line in result.stdout.splitlines():
            row = json.loads(line)
            seen.setdefault(int(row["pid"]), row)  # type: ignore[call-overload]
        time.sleep(0.2)
    return list(seen.values())


def test_an_agent_that_lifted_its_limits_is_ended_from_outside(short_caps, watchdog_dsn):
    """Fails on main before the watchdog: there was no command and no limit an agent could
    not lift (`statement_timeout = 0` and an idle transaction were held indefinitely)."""
    with (
        temporary_login(short_caps, "keel_agent") as agent,
        temporary_login(short_caps, "keel_app") as app,
        temporary_login(short_caps, "keel_worker") as worker,
    ):
        idle = lifted(agent)
        idle.execute("begin")
        idle.execute("select 1")
        sleeper = lifted(agent)
        errors: list[BaseException] = []

        def sleep() -> None:
            try:
                sleeper.execute("select pg_sleep(600)")
            except psycopg.Error as error:
                errors.append(error)

        thread = threading.Thread(target=sleep)
        thread.start()
        busy_worker = lifted(worker)
        busy_worker.execute("begin")
        busy_worker.execute("select 1")
        # Not the watchdog's to end: a trusted app login and a login outside keel.
        trusted = psycopg.connect(app, autocommit=True)
        trusted.execute("begin")
        trusted.execute("select 1")
        outsider = psycopg.connect(short_caps, autocommit=True)
        outsider.execute("begin")
        outsider.execute("select 1")
        try:
            idle_pid, sleeper_pid = idle.info.backend_pid, sleeper.info.backend_pid
            worker_pid = busy_worker.info.backend_pid
            targets = {idle_pid, sleeper_pid, worker_pid}
            # A dry run first: it reports, ends nothing.
            reported = watch_until(watchdog_dsn, targets, "--dry-run")
            assert {r["terminated"] for r in reported} == {False}
            assert all(alive(short_caps, pid) for pid in targets)

            ended = watch_until(watchdog_dsn, targets)
            by_pid = {int(r["pid"]): r for r in ended}  # type: ignore[call-overload]
            assert {pid: by_pid[pid]["terminated"] for pid in targets} == dict.fromkeys(
                targets, True
            )
            assert by_pid[sleeper_pid]["measure"] in ("statement", "transaction")
            assert by_pid[idle_pid]["measure"] in (
                "idle in transaction",
                "transaction",
            )
            assert by_pid[worker_pid]["role_group"] == "keel_worker"
            assert by_pid[idle_pid]["role_group"] == "keel_agent"
            thread.join(DEADLINE)
            assert len(errors) == 1, errors
            with pytest.raises(psycopg.OperationalError):
                idle.execute("select 1")
            assert trusted.info.backend_pid not in by_pid
            assert outsider.info.backend_pid not in by_pid
            assert alive(short_caps, trusted.info.backend_pid)
            assert alive(short_caps, outsider.info.backend_pid)
        finally:
            for conn in (idle, sleeper, busy_worker, trusted, outsider):
                conn.close()
            thread.join(DEADLINE)


def test_the_watchdog_names_the_privileges_it_lacks(short_caps):
    with temporary_login(short_caps, "keel_watchdog") as bare:
        result = run_agentkeel("watchdog", "--dsn", bare)
    assert result.returncode == ExitCode.PERMISSION, result
    assert "pg_read_all_stats" in result.stderr and "pg_signal_backend" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_no_application_login_may_run_the_watchdog(short_caps):
    for group in ("keel_agent", "keel_worker", "keel_app", "keel_relay"):
        with (
            temporary_login(short_caps, group) as dsn,
            psycopg.connect(dsn) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("select * from keel.watchdog(false)")


def test_the_caps_are_read_from_settings(short_caps):
    with psycopg.connect(short_caps) as conn:
        caps = {
            (group, measure): cap.total_seconds()
            for group, measure, _, cap in conn.execute("select * from keel.watchdog_caps()")
        }
        conn.execute("delete from keel.settings where setting = 'agent_max_statement_seconds'")
        conn.execute(
            "update keel.settings set value = '0' where setting = 'worker_max_transaction_seconds'"
        )
        after = dict(
            conn.execute(
                "select role_group || ' ' || measure, cap from keel.watchdog_caps()"
                " where (role_group, measure)"
                " in (('keel_agent', 'statement'), ('keel_worker', 'transaction'))"
            ).fetchall()
        )
    assert caps[("keel_agent", "statement")] == 1
    assert caps[("keel_worker", "transaction")] == 3
    assert after["keel_agent statement"].total_seconds() == 30  # no row: the default
    assert after["keel_worker transaction"] is None  # 0: no cap
