"""PgBouncer in transaction mode in front of a test server, for tests that go through a pooler.

Production applications connect through a pooler, so the client, the suite and the migrator
are tested through one (DESIGN.md, "Running Postgres"). ``PgBouncer(host, port)`` starts a
``pgbouncer`` process on a free loopback port that forwards every database of that server
(``* = host=... port=...``) in ``pool_mode = transaction`` with ``auth_type = trust``;
``dsn_for(dsn)`` turns a DSN of that server into the same DSN through the pooler.

PgBouncer refuses to run as root: as root it runs as an unprivileged OS user
($AGENTKEEL_PG_USER, default ``postgres``), like the embedded cluster. The fixtures in
conftest.py (``through_pgbouncer``) skip with a reason when pgbouncer is not installed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from psycopg import conninfo

from agentkeel.embedded import free_port

SEARCHED = ("PATH", "/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/opt/homebrew/bin")


class PgBouncerNotFound(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            "pgbouncer is not installed (looked in " + ", ".join(SEARCHED) + "): "
            "`apt-get install pgbouncer` (.ci/run does)"
        )


def find_pgbouncer() -> Path:
    found = shutil.which("pgbouncer")
    if found:
        return Path(found)
    for folder in SEARCHED[1:]:
        candidate = Path(folder) / "pgbouncer"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise PgBouncerNotFound()


class PgBouncer:
    """``with PgBouncer("127.0.0.1", 5432) as bouncer: bouncer.dsn_for(dsn)``."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 10,
        round_robin: bool = False,
        run_as: str | None = None,
        ignore_options: bool = True,
    ) -> None:
        self.binary = find_pgbouncer()
        self.server_host = server_host
        self.server_port = server_port
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        # PgBouncer reuses the most recently used server connection (LIFO) unless
        # server_round_robin is on: then consecutive transactions of one client land on
        # different backends, the worst case a transaction pooler is allowed to produce.
        self.round_robin = round_robin
        # PgBouncer's default refuses a client that sends the ``options`` startup parameter;
        # ignore_options=False keeps that default, to prove a client never sends it.
        self.ignore_options = ignore_options
        self.run_as = run_as or (
            os.environ.get("AGENTKEEL_PG_USER", "postgres") if os.geteuid() == 0 else None
        )
        self.base: Path | None = None
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.users: set[str] = set()

    @property
    def logfile(self) -> Path:
        assert self.base is not None
        return self.base / "pgbouncer.log"

    def dsn_for(self, dsn: str) -> str:
        """The same database and user as ``dsn`` (a DSN of this server), through the pooler."""
        if self.port is None:
            raise RuntimeError("pgbouncer is not running")
        params = conninfo.conninfo_to_dict(dsn)
        user = str(params.get("user") or "postgres")
        if user not in self.users:
            self.users.add(user)
            self._write_users()
            self._admin("RELOAD")
        params.pop("hostaddr", None)
        params.update(host="127.0.0.1", port=str(self.port), user=user)
        return conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> PgBouncer:
        uid = gid = None
        if self.run_as is not None:
            user = pwd.getpwnam(self.run_as)
            uid, gid = user.pw_uid, user.pw_gid
        self.base = Path(tempfile.mkdtemp(prefix="agentkeel-pgbouncer-"))
        if uid is not None and gid is not None:
            os.chown(self.base, uid, gid)
        self.users = {"postgres"}
        self._write_users()
        ignored = "extra_float_digits,options" if self.ignore_options else "extra_float_digits"
        for _ in range(5):
            self.port = free_port()
            config = self.base / "pgbouncer.ini"
            config.write_text(
                "[databases]\n"
                f"* = host={self.server_host} port={self.server_port}\n"
                "[pgbouncer]\n"
                "listen_addr = 127.0.0.1\n"
                f"listen_port = {self.port}\n"
                "unix_socket_dir =\n"
                "auth_type = trust\n"
                f"auth_file = {self.base / 'users.txt'}\n"
                "admin_users = postgres\n"
                # Logins the pooler was not told about (the suite's temporary akc_ roles)
                # are looked up on the server, as a production auth_query setup does.
                "auth_user = postgres\n"
                "auth_query = select usename, passwd from pg_catalog.pg_shadow"
                " where usename = $1\n"
                f"pool_mode = {self.pool_mode}\n"
                f"default_pool_size = {self.pool_size}\n"
                f"server_round_robin = {int(self.round_robin)}\n"
                "max_client_conn = 200\n"
                f"ignore_startup_parameters = {ignored}\n"
                f"logfile = {self.logfile}\n"
                f"pidfile = {self.base / 'pgbouncer.pid'}\n"
            )
            self.proc = subprocess.Popen(
                [str(self.binary), str(config)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self.base,
                start_new_session=True,
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,
            )
            if self._wait_listening():
                return self
            self._stop_process()  # port taken between probe and bind: try another
        log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
        self.cleanup()
        raise RuntimeError(f"pgbouncer did not start:\n{log}")

    def _wait_listening(self, timeout: float = 15) -> bool:
        assert self.proc is not None and self.port is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return True
            time.sleep(0.05)
        return False

    def _write_users(self) -> None:
        assert self.base is not None
        path = self.base / "users.txt"
        path.write_text("".join(f'"{u}" ""\n' for u in sorted(self.users)))
        path.chmod(0o644)

    def _admin(self, command: str) -> None:
        """A command on PgBouncer's admin console (database ``pgbouncer``)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres", autocommit=True
        ) as conn:
            conn.execute(command)

    def _stop_process(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def cleanup(self) -> None:
        try:
            self._stop_process()
        finally:
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
            self.port = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
