"""agentkeel on a real Citus cluster (issue 20): installed as docs/citus.md says, then used and
attacked with the logins docs/security.md describes. Needs $AGENTKEEL_CITUS_DSN (a coordinator's
superuser DSN, ../shared/citus/cluster.sh dsn); skipped with that reason without it.

Every database here is fresh on every node (tests/citus_cluster.py); most tests share one
per module, migrated and distributed with `agentkeel migrate up` and `agentkeel distribute
--apply`, with logins of each keel role made for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

import citus_cluster
from agentkeel.checkpoints import StaticKeyProvider
from agentkeel.client import Keel, set_tenant_context, set_tenant_token
from agentkeel.errors import InvalidArgument, TenantContextMismatch
from agentkeel.sessions import Sessions
from agentkeel_conformance.fixtures import role_defaults
from conftest import REPO, run_agentkeel

pytestmark = pytest.mark.citus

WORKFLOW = "citus"
EDGES = [("queued", "running"), ("running", "done")]
ROLES = ("keel_app", "keel_worker", "keel_agent", "keel_relay")


@dataclass(frozen=True)
class Cluster:
    admin: str  # the coordinator, as a superuser, in the test database
    logins: dict[str, str]  # keel role -> DSN of a login in it
    agent2: str  # a second agent login
    a: uuid.UUID
    b: uuid.UUID

    def keel(self, role: str, token: str | None = None) -> Keel:
        return Keel(psycopg.connect(self.logins[role], autocommit=True), tenant_token=token)


def _login(admin: str, role: str) -> tuple[str, str]:
    """A login in the group, with the group's role settings copied onto it, as a DBA
    does (agentkeel check's role_timeouts reads every login of the server)."""
    name = f"akt_citus_{role.removeprefix('keel_')}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn, conn.transaction():
        conn.execute(
            sql.SQL("create role {} login in role {}").format(
                sql.Identifier(name), sql.Identifier(role)
            )
        )
        for setting, value in role_defaults(conn, role).items():
            conn.execute(
                sql.SQL("alter role {} set {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )
    return name, conninfo.make_conninfo(admin, user=name)


@pytest.fixture(scope="module")
def cluster(citus_admin_dsn: str) -> Iterator[Cluster]:
    made: list[str] = []
    try:
        with citus_cluster.fresh_database(citus_admin_dsn) as admin:
            for step in (("migrate", "up"), ("distribute", "--apply")):
                result = run_agentkeel(*step, "--dsn", admin)
                assert result.returncode == 0, result.stderr
            logins = {}
            for role in ROLES:
                name, dsn = _login(admin, role)
                made.append(name)
                logins[role] = dsn
            name, agent2 = _login(admin, "keel_agent")
            made.append(name)
            with psycopg.connect(admin, autocommit=True) as conn:
                Keel(conn).define_workflow(WORKFLOW, 1, "queued", EDGES)
            with psycopg.connect(logins["keel_app"], autocommit=True) as conn:
                app = Keel(conn)
                a = app.create_tenant("citus-a").tenant_id
                b = app.create_tenant("citus-b").tenant_id
                for tenant in (a, b):
                    app.create_task(tenant, WORKFLOW, 1)
            yield Cluster(admin, logins, agent2, a, b)
    finally:
        citus_cluster.drop_roles(citus_admin_dsn, made)


def _workers(cluster: Cluster, query: str) -> list[str]:
    results = citus_cluster.on_workers(cluster.admin, query)
    assert all(ok for ok, _ in results), results
    return [result for _, result in results]


# -- installing ------------------------------------------------------------------------


def test_a_fresh_install_distributes_once_and_stays_migratable(citus_db):
    """Item 1: distribute --apply on a fresh install, twice (the second a no-op), then
    migrate up and distribute again: all exit 0."""
    for args, says in (
        (("migrate", "up"), "applied"),
        (("distribute", "--apply"), "distributed"),
        (("distribute", "--apply"), "already distributed: nothing to do"),
        (("migrate", "up"), "nothing to do"),
        (("distribute", "--apply"), "already distributed: nothing to do"),
    ):
        result = run_agentkeel(*args, "--dsn", citus_db)
        assert result.returncode == 0, (args, result.stderr)
        assert says in result.stdout, (args, result.stdout)


def previous_sql_change() -> str | None:
    """$AGENTKEEL_CITUS_UPGRADE_FROM (a commit), else the commit before the newest that
    changed the SQL or the code that distributes it: the last step of the upgrade path."""
    if os.environ.get("AGENTKEEL_CITUS_UPGRADE_FROM"):
        return os.environ["AGENTKEEL_CITUS_UPGRADE_FROM"]
    if not (REPO / ".git").exists():
        return None
    log = subprocess.run(
        ["git", "log", "--format=%H", "-n", "2", "--", "schema", "functions", "policies",
         "tools/agentkeel"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return log[1] if len(log) == 2 else None


def test_a_distributed_install_upgrades_with_migrate_up_and_distribute(
    citus_admin_dsn, citus_db, tmp_path
):
    """An install that an earlier version migrated and distributed (its own CLI, SQL and
    Citus variants: by default the commit before the newest SQL change, so each step of
    the history is replayed once when it lands) upgrades as docs/citus.md says: this
    version's `migrate up`, then `distribute --apply`; the core of the suite then passes
    as an application login, so what the upgrade added (functions the delegated ones call
    on the workers, columns of distributed tables) is there on every node."""
    ref = previous_sql_change()
    if ref is None:
        pytest.skip("not a git checkout with an earlier version to upgrade from")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "schema", "functions", "policies", "tools"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout  # fmt: skip
    old = tmp_path / "old"
    old.mkdir()
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTKEEL_DSN", "AGENTKEEL_SQL_DIR")}
    for step in (("migrate", "up"), ("distribute", "--apply")):
        result = subprocess.run(
            [sys.executable, "-m", "agentkeel.cli", *step, "--dsn", citus_db],
            env={**env, "PYTHONPATH": str(old / "tools")},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, (ref, step, result.stderr[-2000:])
    for step in (("migrate", "up"), ("distribute", "--apply")):
        result = run_agentkeel(*step, "--dsn", citus_db)
        assert result.returncode == 0, (step, result.stderr[-2000:])
    made = []
    try:
        app, app_dsn = _login(citus_db, "keel_app")
        made.append(app)
        with psycopg.connect(citus_db, autocommit=True) as conn:
            owner = f"akt_citus_owner_{uuid.uuid4().hex[:8]}"
            conn.execute(
                sql.SQL("create role {} login createrole in role keel_owner").format(
                    sql.Identifier(owner)
                )
            )
            made.append(owner)
        suite = run_agentkeel(
            "conformance", "-q", "-n", "2", "--dsn", app_dsn,
            "--owner-dsn", conninfo.make_conninfo(citus_db, user=owner),
            "-k", "g2 or g3 or g5 or g8 or sessions",
        )  # fmt: skip
        assert suite.returncode == 0, suite.stdout[-4000:]
    finally:
        citus_cluster.drop_roles(citus_admin_dsn, made)


def test_no_node_accepts_the_owner_and_every_node_has_the_shipped_grants(cluster):
    """keel_owner owns the tables: no node lets it log in, so Citus can never reach a node
    as it. Functions Citus created on the workers carry the shipped grants only (they were
    made with PUBLIC's EXECUTE until distribute applied the privileges again)."""
    can_login = "select rolcanlogin from pg_roles where rolname = 'keel_owner'"
    with psycopg.connect(cluster.admin) as conn:
        assert conn.execute(can_login).fetchone() == (False,)
    assert set(_workers(cluster, can_login)) == {"f"}
    public = (
        "select count(*) from pg_proc p where p.pronamespace = 'keel'::regnamespace"
        " and (p.proacl is null or exists"
        " (select 1 from aclexplode(p.proacl) a where a.grantee = 0))"
    )
    assert set(_workers(cluster, public)) == {"0"}


def test_token_signing_keys_stay_on_the_coordinator(cluster):
    """The workers hold the context keys (to verify an agent's proof), never the keys that
    sign tenant tokens."""
    Keel(psycopg.connect(cluster.logins["keel_app"], autocommit=True)).mint_tenant_token(cluster.a)
    assert set(_workers(cluster, "select to_regclass('keel.tenant_token_keys')")) == {""}
    digest = (
        "select string_agg(key_version::text || md5(inner_key || outer_key), ',')"
        " from keel.context_keys"
    )
    with psycopg.connect(cluster.admin) as conn:
        row = conn.execute(digest).fetchone()
    assert row is not None and row[0]
    assert set(_workers(cluster, digest)) == {row[0]}


# -- no login acts on a worker as anyone but itself ----------------------------------------

# A transaction block that reaches a worker, per login; the smuggled query then rides on
# its worker connections (Citus sends the whole text of a query holding a SET LOCAL on to
# every worker connection of the transaction, citusdata/citus#356).
OPENERS = {
    "keel_app": "select * from keel.get_task(%(a)s, %(a)s)",
    "keel_worker": "select * from keel.claim_next_tasks('citus-test', 1, '1 second', 'none')",
    "keel_agent": "select * from keel.list_tasks(%(a)s)",
    "keel_relay": "select * from keel.outbox_status()",
}
# Run as whoever the worker connection belongs to. It records who it ran as in a probe
# table that exists on the workers only (on the coordinator every action fails, quietly),
# then tries what the owner of the tables could: stop forcing row-level security, disable
# the append-only trigger, and rewrite every tenant's tasks and history.
SMUGGLED = """set local citus.propagate_set_commands = 'local'; set local work_mem = '8MB';
do $smuggled$
declare
    r record;
begin
    begin
        insert into public.akt_probe (who) values (current_user);
    exception when others then null;
    end;
    for r in
        select c.oid::regclass as t, c.relname from pg_class c
        join pg_namespace n on n.oid = c.relnamespace
        where n.nspname = 'keel' and c.relname ~ '^(tasks|task_events)_[0-9]+$'
    loop
        begin
            execute format('alter table %s no force row level security', r.t);
            execute format('alter table %s disable trigger user', r.t);
            if r.relname like 'tasks%' then
                execute format('update %s set metadata = ''{"smuggled": true}''', r.t);
            else
                execute format('update %s set payload = ''{"smuggled": true}''', r.t);
            end if;
        exception when others then null;
        end;
    end loop;
end
$smuggled$"""


@pytest.fixture
def probe(cluster: Cluster) -> Iterator[None]:
    _workers(
        cluster,
        "create table if not exists public.akt_probe (who text);"
        " grant insert on public.akt_probe to public; truncate public.akt_probe",
    )
    yield
    _workers(cluster, "drop table if exists public.akt_probe")


@pytest.mark.parametrize("role", sorted(OPENERS))
def test_sql_a_login_smuggles_onto_a_worker_runs_as_that_login_and_changes_nothing(
    cluster, probe, role
):
    """The hole the docs used to document: a login that had called a SECURITY DEFINER
    function in its transaction could run SQL of its choosing on the workers as keel_owner
    (worker connections opened by the function as its owner), and with it read another
    tenant's rows, forge tokens, rewrite tasks and history. Now every connection a
    transaction has to a worker is the caller's own login: the smuggled SQL runs as it,
    and can do there exactly what it could do on the coordinator."""
    token = cluster.keel("keel_app").mint_tenant_token(cluster.a)
    conn = psycopg.connect(cluster.logins[role], autocommit=True)
    with conn.transaction():
        if role == "keel_agent":
            set_tenant_token(conn, token)
        elif role == "keel_app":
            set_tenant_context(conn, cluster.a)
        conn.execute(OPENERS[role], {"a": cluster.a}).fetchall()
        psycopg.ClientCursor(conn).execute(SMUGGLED)  # one simple-protocol query
    conn.close()
    who = {
        line
        for result in _workers(cluster, "select string_agg(distinct who, ',') from akt_probe")
        for line in result.split(",")
        if line
    }
    assert who == {conninfo.conninfo_to_dict(cluster.logins[role])["user"]}
    with psycopg.connect(cluster.admin) as conn:
        assert conn.execute(
            "select count(*) from keel.tasks where metadata ? 'smuggled'"
        ).fetchone() == (0,)
        assert conn.execute(
            "select count(*) from keel.task_events where payload ? 'smuggled'"
        ).fetchone() == (0,)
    shards = (
        "select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'keel' and c.relname ~ '^(tasks|task_events)_[0-9]+$'"
        " and (not c.relforcerowsecurity or exists (select 1 from pg_trigger t"
        " where t.tgrelid = c.oid and not t.tgisinternal and t.tgenabled = 'D'))"
    )
    assert set(_workers(cluster, shards)) == {"0"}


@pytest.mark.parametrize("role", ROLES)
def test_a_login_connected_to_a_worker_reaches_no_key_and_no_shard(cluster, role):
    """What any login can run on a worker, by a direct connection or smuggled: no key
    (context or token), no write to any shard, no way to sign a proof. (Trusted logins
    read shards as they read the tables, under row-level security; agents and relays
    read no task at all.)"""
    with psycopg.connect(cluster.admin) as conn:
        worker = citus_cluster.nodes(cluster.admin)[1]
        shard = conn.execute(
            "select shard_name from citus_shards where table_name = 'keel.tasks'::regclass"
            " and nodeport = %s limit 1",
            (worker.port,),
        ).fetchone()
    assert shard is not None
    user = conninfo.conninfo_to_dict(cluster.logins[role])["user"]
    dsn = citus_cluster.node_dsn(
        cluster.admin, worker, str(conninfo.conninfo_to_dict(cluster.admin)["dbname"])
    )
    with psycopg.connect(conninfo.make_conninfo(dsn, user=user), autocommit=True) as conn:
        reads = () if role in ("keel_app", "keel_worker") else (f"select * from {shard[0]}",)
        for query in (
            *reads,
            "select * from keel.context_keys",
            f"update {shard[0]} set metadata = '{{}}'",
            f"alter table {shard[0]} no force row level security",
            "select keel.context_proof_signature(1, 'c1')",
            "select keel.rotate_context_key()",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(query)


def test_an_agents_proof_is_worth_nothing_to_another_login(cluster):
    """The workers trust an agent's tenant through the coordinator's proof of its token,
    bound to the agent's login: another agent login that copies it (from the workers'
    pg_stat_activity, say) is refused there."""
    token = cluster.keel("keel_app").mint_tenant_token(cluster.a)
    with psycopg.connect(cluster.logins["keel_agent"]) as conn:
        set_tenant_token(conn, token)
        (proof,) = conn.execute("select current_setting('keel.context_proof')").fetchone()
        assert conn.execute("select * from keel.list_tasks(%s)", (cluster.a,)).fetchall()
    assert proof.startswith("c1.")
    with psycopg.connect(cluster.agent2) as conn:
        conn.execute(sql.SQL("set local keel.context_proof = {}").format(sql.Literal(proof)))
        conn.execute("select keel.bind_tenant_context()")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("select * from keel.list_tasks(%s)", (cluster.a,)).fetchall()
    assert info.value.sqlstate == "42K07"
    assert "does not verify for this login" in str(info.value)


def test_an_agent_works_in_its_own_tenant_only(cluster):
    token = cluster.keel("keel_app").mint_tenant_token(cluster.a)
    agent = cluster.keel("keel_agent", token)
    tasks = agent.list_tasks(cluster.a)
    assert tasks and {t.tenant_id for t in tasks} == {cluster.a}
    with pytest.raises(TenantContextMismatch):
        agent.list_tasks(cluster.b)


# -- what failed on the cluster ----------------------------------------------------------


def test_autocommit_calls_see_their_tenant(cluster):
    """Item 3: in autocommit every call runs on its tenant's node with its tenant: the
    latest checkpoint loads, the data key and a session are found, a reservation without
    a task and an ack work."""
    conn = psycopg.connect(cluster.logins["keel_app"], autocommit=True)
    app = Keel(conn, key_provider=StaticKeyProvider(os.urandom(32)))
    task = app.create_task(cluster.a, WORKFLOW, 1)
    claimed = app.claim_lease(cluster.a, task.task_id, "w", timedelta(minutes=1))
    app.save_checkpoint(cluster.a, task.task_id, claimed.fencing_token, "INPUT", {"n": 1})
    loaded = app.load_latest_checkpoint(cluster.a, task.task_id)
    assert loaded is not None and loaded.payload == {"n": 1}
    sessions = Sessions(conn)
    sid = f"s-{uuid.uuid4().hex[:8]}"
    sessions.save(cluster.a, sid, {"turn": 1})
    assert sessions.load(cluster.a, sid) is not None
    reserved = app.reserve_operation(cluster.a, None, f"k-{uuid.uuid4()}", "act", "h")
    assert reserved.outcome == "reserved"
    app.transition_task(
        cluster.a,
        task.task_id,
        1,
        "running",
        fencing_token=claimed.fencing_token,
        outbox=[{"topic": "citus.ack", "payload": {"n": 1}}],
    )
    relay = Keel(psycopg.connect(cluster.logins["keel_relay"], autocommit=True))
    claimed_messages = relay.claim_outbox("r", topic_prefix="citus.ack")
    assert len(claimed_messages) == 1
    m = claimed_messages[0]
    relay.ack_outbox(m.tenant_id, m.message_id, m.claim_token)


def test_the_relay_delivers_without_a_notification(cluster, tmp_path: Path):
    """Items 2 and 4: the relay's claim works on a cluster, and it needs no NOTIFY (the one
    transition_task sends fires on the worker): it polls."""
    app = cluster.keel("keel_app")
    task = app.create_task(cluster.b, WORKFLOW, 1)
    app.transition_task(
        cluster.b, task.task_id, 1, "running", outbox=[{"topic": "citus.relay", "payload": {}}]
    )
    out = tmp_path / "delivered.jsonl"
    result = run_agentkeel(
        "relay",
        "--dsn",
        cluster.logins["keel_relay"],
        "--sink",
        f"file:{out}",
        "--once",
        "--topic-prefix",
        "citus.relay",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    delivered = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["task_id"] for m in delivered] == [str(task.task_id)]


def test_held_messages_of_a_key_are_promoted_and_delivered_in_order_on_the_cluster(
    cluster, tmp_path: Path
):
    """Issue 27 item 7 on the cluster: keyed messages behind a pending one are held
    (transition_task on the tenant's node), the ack promotes the next (keel.ack_outbox
    delegated), and a message written while its head was being acked, which that ack could
    not see, is promoted by the relay's sweep (the Citus variant of
    keel.promote_outbox_heads, as the keel_relay login) and delivered, in key order."""
    prefix = f"citus.heads{uuid.uuid4().hex[:6]}"
    app = cluster.keel("keel_app")
    task = app.create_task(cluster.a, WORKFLOW, 1)
    app.transition_task(
        cluster.a,
        task.task_id,
        1,
        "running",
        outbox=[{"topic": f"{prefix}.k", "key": "k", "payload": {"n": n}} for n in (1, 2, 3)],
    )

    def flags() -> list[tuple[int, bool, str]]:
        with psycopg.connect(cluster.admin, autocommit=True) as conn:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(
                    "select (payload ->> 'n')::int, held, state from keel.outbox"
                    " where topic = %s order by created_at, position",
                    (f"{prefix}.k",),
                )
            ]

    assert flags() == [(1, False, "pending"), (2, True, "pending"), (3, True, "pending")]
    with psycopg.connect(cluster.logins["keel_relay"], autocommit=True) as relay:
        for n in (1, 2, 3):
            [(message, token, payload)] = relay.execute(
                "select message_id, claim_token, payload from"
                " keel.claim_outbox('citus-heads', 10, '1 hour', %s)",
                (prefix,),
            ).fetchall()
            assert payload == {"n": n}
            if n < 3:
                relay.execute("select keel.ack_outbox(%s, %s, %s)", (cluster.a, message, token))
        # the race: a writer sees message 3 pending, the ack commits before the writer does
        with psycopg.connect(cluster.logins["keel_app"], autocommit=True) as writer:
            late = Keel(writer)
            with writer.transaction():
                task = late.create_task(cluster.a, WORKFLOW, 1)
                late.transition_task(
                    cluster.a,
                    task.task_id,
                    1,
                    "running",
                    outbox=[{"topic": f"{prefix}.k", "key": "k", "payload": {"n": 4}}],
                )
                relay.execute("select keel.ack_outbox(%s, %s, %s)", (cluster.a, message, token))
    assert flags()[-1] == (4, True, "pending")
    out = tmp_path / "delivered.jsonl"
    result = run_agentkeel(
        "relay",
        "--dsn",
        cluster.logins["keel_relay"],
        "--sink",
        f"file:{out}",
        "--once",
        "--topic-prefix",
        prefix,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["payload"] for line in out.read_text().splitlines()] == [{"n": 4}]
    assert [f[2] for f in flags()] == ["delivered"] * 4


def test_a_message_that_crashes_the_relay_dies_alone_and_is_replayed_on_the_cluster(
    cluster, tmp_path: Path
):
    """Issue 27 items 3 and 6 on the cluster, as the keel_relay login: after a crash the
    relay claims each message again alone (keel.claim_due_message on its tenant's node),
    the innocent one is delivered, the poison one dies by its unreported claims and the
    relay logs it (a multi-shard read of the delivery columns); `relay dead list` finds it
    and `relay dead replay` puts it back (keel.relay_replay_outbox, delegated)."""
    app = cluster.keel("keel_app")
    task = app.create_task(cluster.b, WORKFLOW, 1)
    app.transition_task(
        cluster.b,
        task.task_id,
        1,
        "running",
        outbox=[
            {"topic": "citus.crash.ok", "payload": {"n": 1}},
            {"topic": "citus.crash.poison", "payload": {"n": 2}},
        ],
    )
    with psycopg.connect(cluster.admin, autocommit=True) as conn:
        conn.execute(
            "update keel.settings set value = '2' where setting = 'outbox_max_unreported_claims'"
        )
    relay_dsn = cluster.logins["keel_relay"]
    out = tmp_path / "delivered.jsonl"
    env = {**os.environ, "AGENTKEEL_RELAY_FAILPOINT": "poison=citus.crash.poison"}
    runs = []
    for _ in range(6):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentkeel.cli",
                "relay",
                "--dsn",
                relay_dsn,
                "--sink",
                f"file:{out}",
                "--once",
                "--lease",
                "1",
                "--topic-prefix",
                "citus.crash",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        runs.append(result)
        if result.returncode == 0:
            break
        assert result.returncode == -9, result.stderr
        time.sleep(1.3)
    assert runs[-1].returncode == 0, runs[-1].stderr
    delivered = [json.loads(line)["topic"] for line in out.read_text().splitlines()]
    assert delivered == ["citus.crash.ok"]
    deaths = [json.loads(line) for line in runs[-1].stderr.splitlines() if '"dead letter"' in line]
    assert [(d["topic"], d["decided_by"]) for d in deaths] == [("citus.crash.poison", "claim")]

    listed = run_agentkeel(
        "relay", "dead", "list", "--dsn", relay_dsn, "--tenant", str(cluster.b), "--format", "json"
    )
    assert listed.returncode == 0, listed.stderr
    [dead] = json.loads(listed.stdout)["dead"]
    assert (dead["topic"], dead["attempts"]) == ("citus.crash.poison", 0)
    replayed = run_agentkeel(
        "relay",
        "dead",
        "replay",
        "--dsn",
        relay_dsn,
        "--id",
        dead["message_id"],
        "--format",
        "json",
    )
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["replayed"] == [dead["message_id"]]
    again = run_agentkeel(
        "relay",
        "--dsn",
        relay_dsn,
        "--sink",
        f"file:{out}",
        "--once",
        "--topic-prefix",
        "citus.crash",
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text().splitlines()[-1])["message_id"] == dead["message_id"]
    status = run_agentkeel("relay", "status", "--dsn", relay_dsn, "--format", "json")
    assert status.returncode == 0, status.stderr
    topics = {t["topic"]: t for t in json.loads(status.stdout)["topics"]}
    assert topics["citus.crash.ok"]["delivered_last_hour"] == 1
    assert topics["citus.crash.poison"]["delivered_last_hour"] == 1


def test_the_recoverer_takes_over_an_expired_lease(cluster):
    """Item 2: agentkeel recover on a cluster."""
    app = cluster.keel("keel_app")
    task = app.create_task(cluster.a, WORKFLOW, 1)
    app.claim_lease(cluster.a, task.task_id, "dead", timedelta(milliseconds=1))
    result = run_agentkeel(
        "recover", "--dsn", cluster.logins["keel_worker"], "--workflow", WORKFLOW
    )
    assert result.returncode == 0, result.stderr
    recovered = app.get_task(cluster.a, task.task_id)
    assert recovered is not None and recovered.lease_owner is None
    assert [e.event_type for e in app.task_events(cluster.a, task.task_id)][-1] == "RECOVERED"


def _claim_tries(cluster: Cluster) -> int:
    """keel.claim_due_task calls on the workers so far (track_functions is on there)."""
    return sum(
        int(r or 0)
        for r in _workers(
            cluster,
            "select sum(calls) from pg_stat_user_functions where funcname = 'claim_due_task'",
        )
    )


def test_a_tenant_locking_its_due_tasks_costs_another_tenants_claim_few_tries(cluster):
    """An open transaction holds locks on 2,000 of tenant A's due tasks, all older than
    B's one. A worker's claim returns B's task after 32 tries of A's and one scan of A's
    tasks on its node (which finds none unlocked): each is keel.claim_due_task on a worker,
    a round trip, counted here by track_functions. Before, the claim tried all 2,000.
    (The tries are counted once both nodes have reported: at least one of A's and the
    claim of B's.)"""
    workflow = f"citus-noisy-{uuid.uuid4().hex[:6]}"
    dbname = conninfo.conninfo_to_dict(cluster.admin)["dbname"]
    with psycopg.connect(cluster.admin, autocommit=True) as admin:  # Citus passes it on
        admin.execute(
            sql.SQL("alter database {} set track_functions = 'pl'").format(
                sql.Identifier(str(dbname))
            )
        )
    assert _workers(cluster, "show track_functions") == ["pl", "pl"]
    with psycopg.connect(cluster.admin, autocommit=True) as admin:
        Keel(admin).define_workflow(workflow, 1, "queued", EDGES)
        with admin.transaction():
            set_tenant_context(admin, cluster.a)
            admin.execute(
                "insert into keel.tasks (tenant_id, workflow, workflow_version, state, wake_at)"
                " select %s, %s, 1, 'queued', now() - interval '1 hour'"
                " from generate_series(1, 2000)",
                (cluster.a, workflow),
            )
        b_task = cluster.keel("keel_app").create_task(cluster.b, workflow, 1)
        try:
            with psycopg.connect(cluster.admin) as holder:
                set_tenant_context(holder, cluster.a)
                locked = holder.execute(
                    "select count(*) from (select 1 from keel.tasks where tenant_id = %s"
                    " and workflow = %s for update) as l",
                    (cluster.a, workflow),
                ).fetchone()
                assert locked == (2000,)
                before = _claim_tries(cluster)
                with psycopg.connect(cluster.logins["keel_worker"], autocommit=True) as worker:
                    claimed = worker.execute(
                        "select tenant_id, task_id"
                        " from keel.claim_next_task('noisy', '1 minute', %s)",
                        (workflow,),
                    ).fetchall()
                assert claimed == [(cluster.b, b_task.task_id)]
                deadline = time.monotonic() + 60
                while (tries := _claim_tries(cluster) - before) < 2:
                    assert time.monotonic() < deadline, "no claim_due_task call was counted"
                    time.sleep(0.2)
                holder.rollback()
            assert tries <= 34, f"{tries} calls of keel.claim_due_task for one claim"
        finally:
            for tenant in (cluster.a, cluster.b):
                with admin.transaction():
                    set_tenant_context(admin, tenant)
                    admin.execute("set local keel.purge = on")
                    admin.execute("delete from keel.tasks where workflow = %s", (workflow,))
            admin.execute("delete from keel.workflows where workflow = %s", (workflow,))


def test_the_watchdog_ends_an_agent_that_lifted_its_limits_on_every_node(cluster):
    """`agentkeel watchdog` against the coordinator ends an agent's backend there that sits
    in a transaction past its cap (with its own timeouts at 0), and so the connections
    that backend opened to the workers for its delegated call."""
    token = cluster.keel("keel_app").mint_tenant_token(cluster.a)
    agent_login = conninfo.conninfo_to_dict(cluster.agent2)["user"]
    watchdog, watchdog_dsn = _login(cluster.admin, "keel_watchdog")
    with psycopg.connect(cluster.admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("grant pg_read_all_stats, pg_signal_backend to {}").format(
                sql.Identifier(watchdog)
            )
        )
        conn.execute(
            "update keel.settings set value = '1'"
            " where setting = 'agent_max_idle_in_transaction_seconds'"
        )
    idle_on_workers = (
        "select count(*) from pg_stat_activity"
        f" where usename = '{agent_login}' and state like 'idle in transaction%'"
    )
    agent = psycopg.connect(cluster.agent2, autocommit=True)
    try:
        for setting in ("statement_timeout", "idle_in_transaction_session_timeout"):
            agent.execute(sql.SQL("set {} = 0").format(sql.Identifier(setting)))
        agent.execute("begin")
        set_tenant_token(agent, token)
        assert agent.execute("select * from keel.list_tasks(%s)", (cluster.a,)).fetchall()
        pid = agent.info.backend_pid
        assert "1" in _workers(cluster, idle_on_workers)  # its delegated call's connection
        deadline = time.monotonic() + 120
        ended: list[dict[str, object]] = []
        while not ended:
            assert time.monotonic() < deadline, "the watchdog never ended the agent"
            result = run_agentkeel("watchdog", "--dsn", watchdog_dsn, "--format", "json")
            assert result.returncode == 0, result.stderr
            ended = [r for r in map(json.loads, result.stdout.splitlines()) if r["pid"] == pid]
            time.sleep(0.2)
        assert ended[0]["terminated"] is True
        assert ended[0]["login"] == agent_login
        with pytest.raises(psycopg.OperationalError):
            agent.execute("select 1")
        while set(_workers(cluster, idle_on_workers)) != {"0"}:
            assert time.monotonic() < deadline, "a worker kept the agent's transaction"
            time.sleep(0.2)
    finally:
        agent.close()
        with psycopg.connect(cluster.admin, autocommit=True) as conn:
            conn.execute(
                "update keel.settings set value = '30'"
                " where setting = 'agent_max_idle_in_transaction_seconds'"
            )
        citus_cluster.drop_roles(cluster.admin, [watchdog])


def test_the_client_refuses_a_missing_tenant_before_sending(cluster):
    """Citus 13.2 crashes the coordinator on a NULL distribution argument
    (docs/citus.md): the client never sends one."""
    with pytest.raises(InvalidArgument):
        cluster.keel("keel_app").get_task(None, uuid.uuid4())  # type: ignore[arg-type]
    with psycopg.connect(cluster.admin) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


# -- agentkeel check reads every node --------------------------------------------------


def test_check_names_what_changed_on_a_worker(citus_keel):
    """`agentkeel check` passes on a fresh cluster, and names, on the worker where it
    happened, what the coordinator's catalog would never show: a disabled append-only
    trigger and row-level security no longer forced on a shard, a function and grants
    made there, the owner allowed to log in, token keys copied there."""
    assert run_agentkeel("check", "--dsn", citus_keel).returncode == 0
    worker = citus_cluster.nodes(citus_keel)[1]
    dbname = str(conninfo.conninfo_to_dict(citus_keel)["dbname"])
    with psycopg.connect(citus_cluster.node_dsn(citus_keel, worker, dbname)) as conn:
        conn.execute("set citus.show_shards_for_app_name_prefixes = '*'")
        conn.execute("set citus.enable_ddl_propagation = off")
        (shard,) = conn.execute(
            "select c.oid::regclass::text from pg_class c"
            " where c.relnamespace = 'keel'::regnamespace"
            " and c.relname ~ '^task_events_[0-9]+$' limit 1"
        ).fetchone()
        for statement in (
            f"alter table {shard} disable trigger user",
            f"alter table {shard} no force row level security",
            f"grant select on {shard} to public",
            "create function keel.extra() returns int language sql as 'select 1'",
            "create table keel.tenant_token_keys (key_version integer)",
        ):
            conn.execute(statement.encode())
    result = run_agentkeel("check", "--dsn", citus_keel, "--format", "json")
    assert result.returncode == 1, result.stderr
    found = {
        (f["object"].split(" ", 1)[1], f["problem"])
        for f in json.loads(result.stdout)["findings"]
        if f["rule"] == "citus_nodes"
    }
    assert all(
        f["object"].startswith(f"{worker.host}:{worker.port} ")
        for f in json.loads(result.stdout)["findings"]
        if f["rule"] == "citus_nodes"
    )
    for expected in (
        (f"{shard} task_events_append_only_{shard.rsplit('_', 1)[1]}", "a trigger is disabled"),
        (shard, "row-level security is not enabled and forced"),
        (shard, "PUBLIC has SELECT on it"),
        ("keel.extra()", "a function on this node that the coordinator does not have"),
        ("keel.tenant_token_keys", "the token signing keys are on this worker"),
    ):
        assert any(o == expected[0] and p.startswith(expected[1]) for o, p in found), (
            expected,
            found,
        )


# -- bootstrap ----------------------------------------------------------------------------


def test_bootstrap_for_citus_makes_every_login_on_every_node(citus_db, citus_admin_dsn):
    """Item 7: on a cluster the database exists, with the extension; roles created from
    another database would stay on the coordinator. `bootstrap --citus` runs in the
    database, so every role reaches every worker, and the usual steps follow: migrate up
    and distribute as a superuser (Citus makes roles an older database made on every node
    with ALTER ROLE ... NOSUPERUSER), calls as an application login, workflows defined by
    the migrator."""
    tag = uuid.uuid4().hex[:8]
    migrator, app, agent = f"akt_mig_{tag}", f"akt_app_{tag}", f"akt_agent_{tag}"
    dbname = str(conninfo.conninfo_to_dict(citus_db)["dbname"])
    try:
        result = run_agentkeel(
            "bootstrap", "--citus", "--apply", "--dsn", citus_db, "--database", dbname,
            "--migrator", migrator, "--app-login", app, "--agent-login", agent,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        roles = (
            "select string_agg(r.rolname || ':' || coalesce(array_to_string(s.setconfig, ';'),"
            " ''), ',' order by r.rolname) from pg_roles r left join pg_db_role_setting s"
            f" on s.setrole = r.oid and s.setdatabase = 0 where r.rolname like '%\\_{tag}'"
        )
        with psycopg.connect(citus_db) as conn:
            (expected,) = conn.execute(roles).fetchone()
            owner = conn.execute(
                "select pg_get_userbyid(datdba) from pg_database where datname = %s", (dbname,)
            ).fetchone()
        assert agent in expected and "statement_timeout" in expected and owner == (migrator,)
        assert {r for _, r in citus_cluster.on_workers(citus_db, roles)} == {expected}
        as_migrator = conninfo.make_conninfo(citus_db, user=migrator)
        for step in (("migrate", "up"), ("distribute", "--apply")):
            result = run_agentkeel(*step, "--dsn", citus_db)
            assert result.returncode == 0, result.stderr
        with psycopg.connect(as_migrator, autocommit=True) as conn:
            Keel(conn).define_workflow(WORKFLOW, 1, "queued", EDGES)
        with psycopg.connect(conninfo.make_conninfo(citus_db, user=app), autocommit=True) as c:
            tenant = Keel(c).create_tenant("bootstrapped").tenant_id
            assert Keel(c).create_task(tenant, WORKFLOW, 1).state == "queued"
        # CONNECT by name on every node: no other login, and no keel_* group, gets in.
        acl = f"select datacl::text from pg_database where datname = '{dbname}'"
        with psycopg.connect(citus_db) as conn:
            (coordinator_acl,) = conn.execute(acl).fetchone()
        for node_acl in [coordinator_acl, *(r for _, r in citus_cluster.on_workers(citus_db, acl))]:
            items = [item.split("=") for item in node_acl.strip("{}").split(",")]
            connect = {grantee for grantee, rights in items if "c" in rights.split("/")[0]}
            assert connect == {migrator, app, agent}, node_acl
    finally:
        with psycopg.connect(citus_db, autocommit=True) as conn:  # Citus: on every node
            conn.execute(
                sql.SQL("alter database {} owner to current_user").format(sql.Identifier(dbname))
            )
            for login in (app, agent):  # Citus revokes on every node
                conn.execute(
                    sql.SQL("revoke connect on database {} from {}").format(
                        sql.Identifier(dbname), sql.Identifier(login)
                    )
                )
        citus_cluster.drop_roles(citus_admin_dsn, [app, agent, migrator])


def test_bench_runs_on_a_coordinator(citus_keel):
    """Item 6: agentkeel bench --dsn <coordinator> (it set its tenant with set_config, which
    Citus never propagates): the workloads and the policy cost run, and the keel side does
    work."""
    result = run_agentkeel(
        "bench", "--dsn", citus_keel, "--workload", "claim-complete", "--workload",
        "empty-claim", "--workload", "policy", "--rows", "200", "--workers", "2",
        "--duration", "1", "--repeats", "1", "--format", "json", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    runs = report["runs"] if isinstance(report, dict) else report
    keel = {r["workload"]: r for r in runs if r.get("side") == "keel"}
    assert keel["claim-complete"]["ops"] > 0 and keel["empty-claim"]["ops"] > 0
