"""Fixtures: the database under test, connections with timeouts, fresh tenants, a workflow."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.client import Keel, Task
from agentkeel.embedded import EmbeddedPostgres
from agentkeel.exitcodes import ExitCode
from agentkeel.migrate import migrate_up
from agentkeel.pooler import is_pooled
from agentkeel.preflight import has_schema
from agentkeel.sql_files import sql_root
from agentkeel.target import embedded_cluster
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import LIVE_TENANTS, delete_tenant, suite_tenant

TENANT_PREFIX = "agentkeel-conformance-"
WORKFLOW_PREFIX = "akc-"


# The workflow the suite drives: every test that needs edges uses this one.
EDGES = (
    ("queued", "running"),
    ("queued", "cancelled"),
    ("running", "waiting"),
    ("waiting", "running"),
    ("running", "done"),
    ("running", "failed"),
)

Connect = Callable[..., psycopg.Connection]


@dataclass(frozen=True)
class Workflow:
    name: str
    version: int
    initial_state: str = "queued"


def _given_dsn(config: pytest.Config) -> str | None:
    return config.getoption("--keel-dsn") or os.environ.get("AGENTKEEL_DSN")


@pytest.fixture(scope="session")
def keel_cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedPostgres | None]:
    """The embedded cluster when the suite made one (the crash tier stops and restarts it);
    None when testing a database given with --dsn or --testcontainers."""
    if _given_dsn(request.config) or request.config.getoption("--keel-testcontainers"):
        yield None
        return
    with embedded_cluster() as pg:
        yield pg


@contextmanager
def testcontainers_database(image: str) -> Iterator[str]:
    """A migrated PostgreSQL in Docker; every test skips, with the reason, without Docker."""
    try:
        import docker
        from testcontainers.postgres import PostgresContainer
    except ImportError:
        pytest.skip("--testcontainers needs: pip install 'agentkeel[testcontainers]'")
    try:
        docker.from_env().ping()
    except Exception as err:
        pytest.skip(
            f"--testcontainers: no Docker daemon answers ({type(err).__name__}); "
            "without the option the suite uses an embedded cluster"
        )
    with PostgresContainer(image, driver=None) as container:
        dsn = container.get_connection_url()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate_up(conn, sql_root())
        yield dsn


@pytest.fixture(scope="session")
def keel_dsn(
    request: pytest.FixtureRequest, keel_cluster: EmbeddedPostgres | None
) -> Iterator[str]:
    """The database under test: --dsn / $AGENTKEEL_DSN, --testcontainers, else an embedded
    throwaway cluster."""
    if keel_cluster is not None:
        yield keel_cluster.dsn
        return
    image = request.config.getoption("--keel-testcontainers")
    if image:
        with testcontainers_database(image) as dsn:
            yield dsn
        return
    given = _given_dsn(request.config)
    assert given is not None
    with psycopg.connect(given, autocommit=True, connect_timeout=10) as conn:
        if request.config.getoption("--keel-migrate") and not request.config.getoption(
            "--keel-read-only"
        ):
            migrate_up(conn, sql_root())
        if not has_schema(conn):
            pytest.exit(
                "the agentkeel schema is not installed in the --dsn database: run "
                "`agentkeel migrate up --dsn ...` first, or pass --migrate "
                "(pytest: --keel-migrate)",
                returncode=ExitCode.SCHEMA_MISSING,
            )
    yield given


# Why a test that needs a session's real backend is skipped through a transaction pooler.
THROUGH_A_POOLER = (
    "through a transaction pooler (detected: its cancel key is not the backend's pid): this "
    "test needs each session's own backend (pg_isolation_test_session_is_blocked, "
    "pg_cancel_backend, pg_terminate_backend by pid), which a pooler hands to whoever runs "
    "the next transaction; run it with a --dsn that connects to PostgreSQL directly"
)


@pytest.fixture(scope="session")
def keel_pooled(keel_dsn: str) -> bool:
    """Whether the database under test is reached through a connection pooler."""
    with psycopg.connect(
        keel_dsn, autocommit=True, connect_timeout=10, prepare_threshold=None
    ) as conn:
        return is_pooled(conn)


@pytest.fixture
def direct_connection(keel_pooled: bool) -> None:
    """Skip, saying why, a test that needs the real backend of each of its sessions when
    the suite runs through a transaction pooler: there its verdict would be about the
    pooler, not about the guarantee."""
    if keel_pooled:
        pytest.skip(THROUGH_A_POOLER)


@pytest.fixture(scope="session")
def owner_dsn(request: pytest.FixtureRequest, keel_dsn: str) -> str:
    """A member of keel_owner: removes what the suite made, runs the owner-only tests.
    Tests that need it are skipped, with the reason, when the role lacks the rights."""
    dsn = (
        request.config.getoption("--keel-owner-dsn")
        or os.environ.get("AGENTKEEL_OWNER_DSN")
        or keel_dsn
    )
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("select pg_has_role('keel_owner', 'member')").fetchone()
    if not row or not row[0]:
        pytest.skip(
            "needs a member of keel_owner to remove its test tenants afterwards: "
            "pass --owner-dsn (pytest: --keel-owner-dsn) or $AGENTKEEL_OWNER_DSN"
        )
    return dsn


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Callable[[str, str], Path]:
    """Write a failure artifact; returns its path."""

    def _write(name: str, text: str) -> Path:
        folder = Path(request.config.getoption("--keel-artifacts")).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(text)
        return path

    return _write


@pytest.fixture
def connect(keel_dsn: str, request: pytest.FixtureRequest) -> Iterator[Connect]:
    """Open extra connections (closed after the test): as the --dsn role, with owner=True
    as the owner, or with role="keel_worker" (say) as a member of that keel role (role_dsn);
    other keyword arguments go to psycopg.connect."""
    opened: list[psycopg.Connection] = []

    def _connect(
        *, owner: bool = False, role: str | None = None, **kwargs: Any
    ) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        if owner:
            dsn = request.getfixturevalue("owner_dsn")
        elif role is not None:
            dsn = request.getfixturevalue("role_dsn")(role)
        else:
            dsn = keel_dsn
        conn = suite_connect(dsn, application_name="agentkeel-conformance", **kwargs)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture
def keel(connect: Connect) -> Keel:
    """The client on its own autocommit connection: each call is one transaction."""
    return Keel(connect())


@pytest.fixture
def app_keel(connect: Connect) -> Keel:
    """The client as a member of keel_app: creates tenants and workflows, mints tokens."""
    return Keel(connect(role="keel_app"))


@pytest.fixture
def worker_keel(connect: Connect) -> Keel:
    """The client as a member of keel_worker: claims the next due task of any tenant."""
    return Keel(connect(role="keel_worker"))


@pytest.fixture(scope="session")
def on_citus(keel_dsn: str) -> bool:
    """The database under test is distributed on Citus (keel.tasks is a Citus table)."""
    with suite_connect(keel_dsn, autocommit=True) as conn:
        row = conn.execute("select to_regclass('pg_catalog.pg_dist_partition')").fetchone()
        if not row or row[0] is None:
            return False
        row = conn.execute(
            "select exists (select 1 from pg_catalog.pg_dist_partition"
            " where logicalrelid = 'keel.tasks'::regclass)"
        ).fetchone()
    return bool(row and row[0])


@pytest.fixture(scope="session")
def workflow_dsn(role_dsn: Callable[[str], str], owner_dsn: str, on_citus: bool) -> str:
    """Who defines workflows: a keel_app login; on Citus the owner's login, since a
    workflow lives in reference tables, written on every node as the role that runs
    keel.define_workflow (there SECURITY INVOKER: docs/citus.md)."""
    return owner_dsn if on_citus else role_dsn("keel_app")


@pytest.fixture
def workflow_keel(workflow_dsn: str) -> Iterator[Keel]:
    """The client as whoever defines workflows (workflow_dsn)."""
    with suite_connect(workflow_dsn, autocommit=True) as conn:
        yield Keel(conn)


@pytest.fixture(scope="session")
def workflow(workflow_dsn: str, owner_dsn: str) -> Iterator[Workflow]:
    """A workflow version private to this test session, removed at the end."""
    wf = Workflow(f"{WORKFLOW_PREFIX}{uuid.uuid4().hex[:12]}", 1)
    with suite_connect(workflow_dsn, autocommit=True) as conn:
        Keel(conn).define_workflow(wf.name, wf.version, wf.initial_state, EDGES)
    yield wf
    with suite_connect(owner_dsn, autocommit=True) as conn:
        # Tenants a Ctrl-C left behind first: their tasks would keep the workflow.
        for tenant_id in sorted(LIVE_TENANTS):
            delete_tenant(conn, tenant_id)
        conn.execute("delete from keel.workflows where workflow = %s", (wf.name,))


@pytest.fixture(scope="session")
def live_tenants(owner_dsn: str, workflow: Workflow) -> Iterator[set[uuid.UUID]]:
    """The tenants this process made and has not removed (harness.LIVE_TENANTS): any left at
    the end of the session, by a Ctrl-C in the middle of a test, are removed then. Torn
    down before the workflow, which their tasks would otherwise keep."""
    yield LIVE_TENANTS
    if LIVE_TENANTS:
        with suite_connect(owner_dsn, autocommit=True) as conn:
            for tenant_id in sorted(LIVE_TENANTS):
                delete_tenant(conn, tenant_id)


@pytest.fixture
def make_tenant(
    role_dsn: Callable[[str], str], owner_dsn: str, live_tenants: set[uuid.UUID]
) -> Iterator[Callable[[], uuid.UUID]]:
    """Create fresh tenants; deleting them afterwards removes everything the test wrote."""
    made: list[uuid.UUID] = []

    def _make_tenant() -> uuid.UUID:
        tenant_id = uuid.uuid4()
        # Listed before it exists: a Ctrl-C between the commit and the listing would leave
        # it behind (deleting a tenant that was never made deletes nothing).
        made.append(suite_tenant(tenant_id))
        with suite_connect(role_dsn("keel_app"), autocommit=True) as conn:
            Keel(conn).create_tenant(f"{TENANT_PREFIX}{tenant_id.hex[:12]}", tenant_id)
        return tenant_id

    yield _make_tenant
    with suite_connect(owner_dsn, autocommit=True) as conn:
        for tenant_id in made:
            delete_tenant(conn, tenant_id)


@pytest.fixture
def tenant(make_tenant: Callable[[], uuid.UUID]) -> uuid.UUID:
    """A fresh tenant for one test."""
    return make_tenant()


@pytest.fixture
def new_task(keel: Keel, tenant: uuid.UUID, workflow: Workflow) -> Callable[..., Task]:
    """Create a task of the suite's workflow in the test's tenant."""

    def _new_task(**kwargs: object) -> Task:
        return keel.create_task(tenant, workflow.name, workflow.version, **kwargs)  # type: ignore[arg-type]

    return _new_task


LOGIN_PREFIX = "akc_"


def role_defaults(conn: psycopg.Connection, role: str) -> dict[str, str]:
    """The settings a group role carries in every database (pg_db_role_setting), as
    policies/06_role_settings.sql installed them: the one place they are defined."""
    rows = conn.execute(
        "select unnest(setconfig) from pg_catalog.pg_db_role_setting"
        " where setrole = %s::regrole and setdatabase = 0",
        (role,),
    ).fetchall()
    return dict(str(r[0]).split("=", 1) for r in rows)


@dataclass(frozen=True)
class LoginRole:
    name: str
    keel_role: str
    dsn: str = field(repr=False)  # holds the login's password: never in a report


@pytest.fixture(scope="session")
def login_role(keel_dsn: str, owner_dsn: str) -> Iterator[Callable[..., LoginRole]]:
    """Temporary LOGIN roles that are members of one keel role, dropped at the end; one per
    keel role, or per (keel role, which) for a second login of the same role.

    Attacks must come from a real login: a superuser session that SET ROLEs could simply
    RESET ROLE. Needs a --dsn role that may create roles (superuser or CREATEROLE)."""
    made: dict[tuple[str, str], LoginRole] = {}

    def _login_role(keel_role: str, which: str = "") -> LoginRole:
        if (keel_role, which) in made:
            return made[(keel_role, which)]
        name = f"{LOGIN_PREFIX}{keel_role.removeprefix('keel_')}_{uuid.uuid4().hex[:10]}"
        password = uuid.uuid4().hex
        with suite_connect(owner_dsn, autocommit=True) as conn:
            try:
                # One transaction: nobody (the catalog checks of a parallel run among
                # them) ever sees the login without its group's defaults.
                with conn.transaction():
                    conn.execute(
                        sql.SQL("create role {} login password {} in role {}").format(
                            sql.Identifier(name), sql.Literal(password), sql.Identifier(keel_role)
                        )
                    )
                    # The group's defaults, copied onto the login as docs/security.md tells a
                    # DBA to do.
                    for setting, value in role_defaults(conn, keel_role).items():
                        conn.execute(
                            sql.SQL("alter role {} set {} = {}").format(
                                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                            )
                        )
                    # CONNECT by name, as `agentkeel bootstrap` gives each login: the
                    # database may let no one else in (database_connect). A role that
                    # may not grant it leaves the login to PUBLIC's CONNECT, if any.
                    with suppress(psycopg.errors.InsufficientPrivilege), conn.transaction():
                        lock_database_acl(conn)
                        conn.execute(
                            sql.SQL("grant connect on database {} to {}").format(
                                sql.Identifier(conn.info.dbname), sql.Identifier(name)
                            )
                        )
            except psycopg.errors.InsufficientPrivilege:
                pytest.skip(
                    f"needs a login role that is a member of {keel_role}: the --dsn role may "
                    "not create roles (give --owner-dsn a role with CREATEROLE)"
                )
        role = LoginRole(
            name, keel_role, conninfo.make_conninfo(keel_dsn, user=name, password=password)
        )
        made[(keel_role, which)] = role
        return role

    yield _login_role
    with suite_connect(owner_dsn, autocommit=True) as conn:
        for role in made.values():
            with conn.transaction():
                lock_database_acl(conn)
                conn.execute(
                    sql.SQL("revoke connect on database {} from {}").format(
                        sql.Identifier(conn.info.dbname), sql.Identifier(role.name)
                    )
                )
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role.name)))


# Serializes the suite's own GRANT/REVOKE CONNECT: PostgreSQL takes no lock on the
# database's ACL, so two parallel workers changing it at once fail with "tuple
# concurrently updated" (seen on the Citus cluster under -n 2), and a failed teardown
# left its login roles behind. An advisory lock among the suite's own sessions only.
DATABASE_ACL_LOCK = 0x616B5F61636C  # "ak_acl"


def lock_database_acl(conn: psycopg.Connection) -> None:
    """In the open transaction: wait until no other suite session changes the ACL."""
    conn.execute("select pg_advisory_xact_lock(%s)", (DATABASE_ACL_LOCK,))


@pytest.fixture(scope="session")
def throwaway_database(request: pytest.FixtureRequest) -> bool:
    """True on the embedded cluster: tests that change global state (keys, settings) may run."""
    return not (request.config.getoption("--keel-dsn") or os.environ.get("AGENTKEEL_DSN"))


# The trusted keel roles whose functions the suite calls, and what only they may call.
TRUSTED_ROLES = ("keel_app", "keel_worker")


@pytest.fixture(scope="session")
def role_dsn(keel_dsn: str, login_role: Callable[[str], LoginRole]) -> Callable[[str], str]:
    """A DSN for a member of a trusted keel role (keel_app creates tenants and workflows and
    mints tokens; keel_worker claims across tenants): the database under test's own role when
    it is one (a member of keel_owner may call every function), else a temporary login in
    that role (login_role), else the test is skipped with the reason login_role gives.

    So an application-role --dsn runs the whole suite: what its role may not call is called
    as a login that may, and a test is skipped only when no such login can be made."""
    with suite_connect(keel_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select r, pg_catalog.pg_has_role(r, 'member') from unnest(%s::text[]) as r",
            (["keel_owner", *TRUSTED_ROLES],),
        ).fetchall()
    member = {str(r): bool(m) for r, m in rows}

    def _role_dsn(keel_role: str) -> str:
        if keel_role not in TRUSTED_ROLES:
            raise ValueError(f"role_dsn: {keel_role} is not one of {TRUSTED_ROLES}")
        if member["keel_owner"] or member[keel_role]:
            return keel_dsn
        return login_role(keel_role).dsn

    return _role_dsn
