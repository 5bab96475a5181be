"""`agentkeel check`: passes on a fresh install and names each problem on broken ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.check import CHECKS_DIR, RuleError, rule_files, rule_guarantee, rule_needs, run_rule
from agentkeel.exitcodes import ExitCode
from agentkeel.shipped import MANIFESTS, REGENERATE, inventory, manifest, write_manifest
from agentkeel_conformance.guarantees import GUARANTEES
from conftest import REPO, run_agentkeel


@pytest.fixture(autouse=True)
def installation_connect(request: pytest.FixtureRequest) -> None:
    """Only this installation's logins connect, as after `agentkeel bootstrap`: PUBLIC's
    CONNECT (a fresh database's default) is a database_connect warning."""
    if "migrated_db" not in request.fixturenames:
        return
    with psycopg.connect(request.getfixturevalue("migrated_db"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("revoke connect on database {} from public").format(
                sql.Identifier(conn.info.dbname)
            )
        )


def findings(dsn: str) -> list[dict[str, str]]:
    result = run_agentkeel("check", "--dsn", dsn, "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert (result.returncode == 1) == bool(report["findings"])
    return report["findings"]


def test_a_fresh_install_passes_every_rule(migrated_db):
    result = run_agentkeel("check", "--dsn", migrated_db)
    assert result.returncode == 0, result.stdout
    assert f"all {len(rule_files())} rules pass" in result.stdout


def test_without_a_dsn_it_refuses_rather_than_check_a_throwaway_cluster():
    result = run_agentkeel("check")
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "needs a database" in result.stderr


@pytest.fixture
def owner(migrated_db) -> Iterator[psycopg.Connection]:
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        yield conn


BROKEN = {
    "dropped policy": (
        "drop policy tenant_isolation on keel.operations",
        "rls_forced",
        "keel.operations",
        "no policy",
    ),
    "force removed": (
        "alter table keel.tasks no force row level security",
        "rls_forced",
        "keel.tasks",
        "not forced",
    ),
    "rls disabled": (
        "alter table keel.outbox disable row level security",
        "rls_forced",
        "keel.outbox",
        "not enabled",
    ),
    "unpinned security definer": (
        "create function keel.sneaky() returns int language sql security definer"
        " as 'select 1'; alter function keel.sneaky() owner to keel_owner;"
        " revoke all on function keel.sneaky() from public",
        "security_definer",
        "keel.sneaky()",
        "search_path",
    ),
    "unpinned helper another role may call": (
        "grant execute on function keel.require_tenant(uuid) to keel_app",
        "security_definer",
        "keel.require_tenant(uuid)",
        "runs in its caller's search_path",
    ),
    "unpinned trigger function": (
        "alter function keel.refuse_event_change() reset search_path",
        "security_definer",
        "keel.refuse_event_change()",
        "trigger function without a pinned search_path",
    ),
    "public execute": (
        "grant execute on function keel.claim_next_task(text, interval, text) to public",
        "security_definer",
        "keel.claim_next_task(text,interval,text)",
        "PUBLIC",
    ),
    "id-only foreign key": (
        "create table keel.notes (tenant_id uuid not null, note_id uuid not null, task_id uuid,"
        " constraint notes_pkey primary key (tenant_id, note_id));"
        " alter table keel.notes add constraint notes_task_fkey foreign key (tenant_id, task_id)"
        " references keel.tasks (tenant_id, task_id);"
        " create unique index notes_task_idx on keel.notes (task_id);"
        " alter table keel.notes add constraint notes_task_only_fkey foreign key (task_id)"
        " references keel.notes (task_id)",
        "tenant_keys",
        "keel.notes.notes_task_only_fkey",
        "does not include tenant_id",
    ),
    "unique without tenant": (
        "alter table keel.operations add constraint operations_key_global unique (idempotency_key)",
        "tenant_keys",
        "keel.operations.operations_key_global",
        "does not include tenant_id",
    ),
    "view without security_invoker": (
        "create view keel.all_tasks as select * from keel.tasks",
        "views_security_invoker",
        "keel.all_tasks",
        "security_invoker",
    ),
    "events updatable": (
        "grant update on keel.task_events to keel_app",
        "events_append_only",
        "keel.task_events",
        "keel_app may UPDATE",
    ),
    "append-only trigger disabled": (
        "alter table keel.task_events disable trigger task_events_append_only",
        "events_append_only",
        "keel.task_events",
        "missing or disabled",
    ),
    "truncate trigger disabled": (
        "alter table keel.task_events disable trigger task_events_append_only_truncate",
        "events_append_only",
        "keel.task_events",
        "task_events_append_only_truncate is disabled",
    ),
    "truncate trigger dropped": (
        "drop trigger task_events_append_only_truncate on keel.task_events",
        "events_append_only",
        "keel.task_events",
        "nothing refuses TRUNCATE",
    ),
    "append-only trigger only for replicas": (
        "alter table keel.task_events enable replica trigger task_events_append_only",
        "events_append_only",
        "keel.task_events",
        "fires only with session_replication_role = replica",
    ),
    "table neither tenant nor global": (
        "create table keel.scratch (id bigint not null, constraint scratch_pkey primary key (id))",
        "tenant_or_global",
        "keel.scratch",
        "neither a tenant table",
    ),
    "tenant table the deletion cannot reach": (
        "create table keel.notes (tenant_id uuid not null, note_id uuid not null,"
        " constraint notes_pkey primary key (tenant_id, note_id),"
        " constraint notes_tenant_fkey foreign key (tenant_id)"
        " references keel.tenants (tenant_id))",
        "tenant_deletion",
        "keel.notes",
        "no foreign key from tenant_id to keel.tenants on delete cascade",
    ),
    "tenant tables in a cycle": (
        "create table keel.ring_a (tenant_id uuid not null, id uuid not null, b uuid,"
        " constraint ring_a_pkey primary key (tenant_id, id), constraint ring_a_tenant_fkey"
        " foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade);"
        " create table keel.ring_b (tenant_id uuid not null, id uuid not null, a uuid,"
        " constraint ring_b_pkey primary key (tenant_id, id), constraint ring_b_tenant_fkey"
        " foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,"
        " constraint ring_b_a_fkey foreign key (tenant_id, a)"
        " references keel.ring_a (tenant_id, id));"
        " alter table keel.ring_a add constraint ring_a_b_fkey"
        " foreign key (tenant_id, b) references keel.ring_b (tenant_id, id)",
        "tenant_deletion",
        "keel.ring_b",
        "cycle of foreign keys",
    ),
    "object owned by another role": (
        "alter table keel.settings owner to keel_app",
        "application_roles",
        "keel.settings",
        "owned by keel_app",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_database_is_reported_by_rule_and_object(owner, migrated_db, case):
    statement, rule, obj, problem = BROKEN[case]
    owner.execute(statement.encode())
    found = [f for f in findings(migrated_db) if f["rule"] == rule and f["object"] == obj]
    assert found, findings(migrated_db)
    assert any(problem in f["problem"] for f in found), found


@pytest.mark.parametrize(
    ("attribute", "problem"), [("bypassrls", "BYPASSRLS"), ("superuser", "superuser")]
)
def test_an_application_role_with_dangerous_attributes_is_reported(
    owner, migrated_db, attribute, problem
):
    owner.execute(f"alter role keel_worker {attribute}")
    try:
        found = [f for f in findings(migrated_db) if f["object"] == "keel_worker"]
    finally:
        owner.execute(f"alter role keel_worker no{attribute}")
    assert any(problem in f["problem"] for f in found), found


def test_an_agent_login_that_is_also_trusted_is_reported(owner, migrated_db):
    owner.execute("create role ak_both login in role keel_agent, keel_app")
    try:
        found = [f for f in findings(migrated_db) if f["object"] == "ak_both"]
    finally:
        owner.execute("drop role ak_both")
    assert any("skip the signed token" in f["problem"] for f in found), found


def test_login_members_without_timeouts_are_reported(owner, migrated_db):
    owner.execute("create role ak_agent_login login in role keel_agent")
    try:
        found = [f for f in findings(migrated_db) if f["rule"] == "role_timeouts"]
        owner.execute("alter role ak_agent_login set statement_timeout = '5s'")
        owner.execute("alter role ak_agent_login set idle_in_transaction_session_timeout = '10s'")
        after = [f for f in findings(migrated_db) if f["rule"] == "role_timeouts"]
    finally:
        owner.execute("drop role ak_agent_login")
    assert {f["object"] for f in found} == {"ak_agent_login"}
    assert after == []


def test_role_timeouts_above_the_watchdog_caps_are_reported(owner, migrated_db):
    """An agent may raise its own login's defaults (ALTER ROLE on itself): main accepted any
    non-zero value, so `statement_timeout = '1d'` passed the check."""
    owner.execute("create role ak_raised_agent login in role keel_agent")
    try:
        owner.execute("alter role ak_raised_agent set statement_timeout = '5s'")
        owner.execute("alter role ak_raised_agent set idle_in_transaction_session_timeout = 10000")
        within = [f for f in findings(migrated_db) if f["rule"] == "role_timeouts"]
        owner.execute(
            sql.SQL("grant connect on database {} to ak_raised_agent").format(
                sql.Identifier(owner.info.dbname)
            )
        )
        agent = conninfo.make_conninfo(migrated_db, user="ak_raised_agent")
        with psycopg.connect(agent, autocommit=True) as conn:
            conn.execute("alter role ak_raised_agent set statement_timeout = '1d'")
        raised = [f for f in findings(migrated_db) if f["rule"] == "role_timeouts"]
        owner.execute(
            "update keel.settings set value = '86400' where setting = 'agent_max_statement_seconds'"
        )
        cap_raised = [f for f in findings(migrated_db) if f["rule"] == "role_timeouts"]
    finally:
        owner.execute("drop owned by ak_raised_agent")
        owner.execute("drop role ak_raised_agent")
    assert within == []
    assert [(f["object"], f["problem"]) for f in raised] == [
        (
            "ak_raised_agent",
            "statement_timeout = 1d exceeds the watchdog's cap of 00:00:30"
            " (keel.watchdog_caps; 0 is no limit)",
        )
    ]
    assert cap_raised == []


def test_connect_for_a_shared_keel_role_or_public_is_named(owner, migrated_db):
    """The keel_* roles are shared by every agentkeel database on the server: CONNECT for
    one of them lets another installation's logins in (an error); PUBLIC's, every login of
    the server, unless pg_hba.conf keeps them out (a warning)."""
    database = sql.Identifier(owner.info.dbname)
    owner.execute(sql.SQL("grant connect on database {} to keel_app, public").format(database))
    try:
        found = {
            (f["level"], f["object"])
            for f in findings(migrated_db)
            if f["rule"] == "database_connect"
        }
    finally:
        owner.execute(
            sql.SQL("revoke connect on database {} from keel_app, public").format(database)
        )
    assert found == {("error", "keel_app"), ("warning", "PUBLIC")}
    assert [f for f in findings(migrated_db) if f["rule"] == "database_connect"] == []


def test_junit_output_has_one_case_per_rule_and_fails_the_broken_one(owner, migrated_db, tmp_path):
    owner.execute("alter table keel.tasks no force row level security")
    report = tmp_path / "check.xml"
    result = run_agentkeel("check", "--dsn", migrated_db, "--format", "junit", "-o", str(report))
    assert result.returncode == 1
    suite = ET.parse(report).getroot()
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {p.stem for p in rule_files()}
    assert cases["rls_forced"].find("failure") is not None
    assert cases["tenant_keys"].find("failure") is None
    guarantees = {
        name: case.find("properties/property[@name='guarantee']").get("value")
        for name, case in cases.items()
    }
    assert guarantees == {p.stem: rule_guarantee(p) for p in rule_files()}


def test_every_rule_file_names_one_known_guarantee():
    guarantees = {p.stem: rule_guarantee(p) for p in rule_files()}
    assert set(guarantees.values()) <= set(GUARANTEES), guarantees
    assert guarantees["events_append_only"] == "G4"
    assert guarantees["role_timeouts"] == "G7"


def test_a_rule_file_without_a_guarantee_is_refused(tmp_path):
    rule = tmp_path / "no_guarantee.sql"
    rule.write_text("select 'no_guarantee' as rule, 'error' as level;\n")
    with pytest.raises(RuleError, match="exactly one guarantee"):
        rule_guarantee(rule)


def test_rows_that_contradict_their_rule_file_are_refused(migrated_db, tmp_path):
    rule = tmp_path / "mixed.sql"
    rule.write_text(
        "select 'mixed' as rule, 'G4' as guarantee, 'error' as level, 'x' as object,"
        " 'p' as problem, 'r' as remedy"
        " union all select 'mixed', 'G1', 'error', 'y', 'p', 'r'\n"
    )
    with (
        psycopg.connect(migrated_db, autocommit=True) as conn,
        pytest.raises(RuleError, match="guarantee 'G1'"),
    ):
        run_rule(conn, rule)


def test_findings_carry_the_guarantee_and_level_of_their_rule(owner, migrated_db):
    owner.execute("grant update on keel.task_events to keel_app")
    owner.execute("alter table keel.tasks no force row level security")
    by_rule = {(f["rule"], f["guarantee"], f["level"]) for f in findings(migrated_db)}
    assert by_rule == {
        ("events_append_only", "G4", "error"),
        ("rls_forced", "G1", "error"),
        ("shipped_grants", "G1", "error"),
    }
    human = run_agentkeel("check", "--dsn", migrated_db)
    assert human.returncode == 1
    assert "G4" in human.stdout and "G1" in human.stdout and "3 error(s)" in human.stdout


def test_human_output_names_the_object_and_exits_1(owner, migrated_db):
    owner.execute("drop policy tenant_isolation on keel.operations")
    result = run_agentkeel("check", "--dsn", migrated_db)
    assert result.returncode == 1
    assert "keel.operations" in result.stdout and "rls_forced" in result.stdout


def test_a_database_without_the_schema_is_refused(db):
    result = run_agentkeel("check", "--dsn", db)
    assert result.returncode == ExitCode.SCHEMA_MISSING
    assert "agentkeel migrate up" in result.stderr


def test_every_rule_file_runs_in_psql_as_is(migrated_db):
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    for path in rule_files():
        if rule_needs(path):  # needs an extension (citus_nodes: tests/test_citus.py)
            continue
        out = subprocess.run(
            ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-q", "-f", str(path), migrated_db],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, (path, out.stderr)
        assert "(0 rows)" in out.stdout
    assert (REPO / "tools" / "agentkeel" / "checks").is_dir()


def test_a_disabled_trigger_on_any_append_only_table_is_named(owner, migrated_db):
    owner.execute(
        "create table keel.audit_log (note text);"
        " create trigger audit_log_append_only before update or delete on keel.audit_log"
        " for each row execute function keel.refuse_event_change();"
        " alter table keel.audit_log disable trigger audit_log_append_only"
    )
    found = {
        f["problem"]
        for f in findings(migrated_db)
        if f["rule"] == "events_append_only" and f["object"] == "keel.audit_log"
    }
    assert "the append-only trigger audit_log_append_only is disabled" in found, found
    assert any("nothing refuses TRUNCATE" in p for p in found), found


def test_a_table_declared_global_and_tenant_owned_is_reported(owner, migrated_db):
    owner.execute("alter table keel.settings add column tenant_id uuid")
    found = [
        f
        for f in findings(migrated_db)
        if f["rule"] == "tenant_or_global" and f["object"] == "keel.settings"
    ]
    assert any("declared global" in f["problem"] for f in found), found


def test_every_table_of_a_fresh_install_is_tenant_or_declared_global(owner):
    declared = {r[0] for r in owner.execute("select table_name from keel.global_tables()")}
    tables = owner.execute(
        "select c.oid::regclass::text, exists (select 1 from pg_attribute a"
        "  where a.attrelid = c.oid and a.attname = 'tenant_id' and not a.attisdropped)"
        " from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'keel' and c.relkind in ('r', 'p')"
    ).fetchall()
    assert declared == {name for name, tenant in tables if not tenant}


def test_the_shipped_manifests_are_what_a_fresh_install_holds(owner):
    for rule in MANIFESTS:
        held, listed = set(inventory(owner, rule)), set(manifest(rule))
        assert held == listed, (
            f"{rule}: run `{REGENERATE}` (a fresh install holds, the list lacks:"
            f" {sorted(held - listed)}; listed, not held: {sorted(listed - held)})"
        )


@pytest.fixture
def new_role(owner) -> Iterator[str]:
    """A role of this test only (roles are cluster-wide), dropped with its grants."""
    name = f"ak_extra_{uuid.uuid4().hex[:8]}"
    owner.execute(f"create role {name}")
    yield name
    owner.execute(f"drop owned by {name}")
    owner.execute(f"drop role {name}")


def test_objects_keel_does_not_ship_are_named(owner, migrated_db):
    owner.execute(
        "create function keel.sneaky() returns int language sql as 'select 1';"
        " revoke all on function keel.sneaky() from public;"
        " create table keel.tenant_notes (tenant_id uuid not null, note text,"
        "  constraint tenant_notes_pkey primary key (tenant_id));"
        " create policy allow_all on keel.tasks using (true);"
        " create sequence keel.counter;"
        " create type keel.mood as enum ('calm');"
        " create view keel.task_count with (security_invoker = true) as"
        "  select count(*) from keel.tasks"
    )
    found = {
        (f["object"], f["problem"]) for f in findings(migrated_db) if f["rule"] == "shipped_objects"
    }
    assert found == {
        ("keel.sneaky()", "a function that agentkeel's files do not define"),
        ("keel.tenant_notes", "a table that agentkeel's files do not define"),
        ("keel.tenant_notes_pkey", "a index that agentkeel's files do not define"),
        ("allow_all on keel.tasks", "a policy that agentkeel's files do not define"),
        ("keel.counter", "a sequence that agentkeel's files do not define"),
        ("keel.mood", "a type that agentkeel's files do not define"),
        ("keel.task_count", "a view that agentkeel's files do not define"),
    }, found


def test_an_extra_index_is_a_warning_and_passes(owner, migrated_db):
    owner.execute("create index tasks_state_idx on keel.tasks (tenant_id, state)")
    result = run_agentkeel("check", "--dsn", migrated_db, "--format", "json")
    assert result.returncode == 0, result.stdout
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["rule"], finding["level"], finding["object"]) == (
        "shipped_objects",
        "warning",
        "keel.tasks_state_idx",
    )


def test_grants_keel_does_not_ship_are_named(owner, migrated_db, new_role):
    owner.execute(
        f"grant execute on function keel.verify_tenant_token(text) to {new_role};"
        " grant select on keel.tenant_token_keys to public;"
        f" grant usage on schema keel to {new_role};"
        f" grant select (payload) on keel.task_events to {new_role};"
        " grant select on keel.tasks to keel_app with grant option;"
        f" alter default privileges for role keel_owner in schema keel"
        f"  grant select on tables to {new_role}"
    )
    found = {
        (f["object"], f["problem"], f["remedy"].split(" (agentkeel ships")[0])
        for f in findings(migrated_db)
        if f["rule"] == "shipped_grants"
    }
    beyond = "beyond the grants agentkeel ships"
    assert found == {
        (
            "keel.verify_tenant_token(text)",
            f"{new_role} has EXECUTE on the function, {beyond}",
            f"REVOKE EXECUTE ON FUNCTION keel.verify_tenant_token(text) FROM {new_role};",
        ),
        (
            "keel.tenant_token_keys",
            f"PUBLIC has SELECT on the table, {beyond}",
            "REVOKE SELECT ON TABLE keel.tenant_token_keys FROM PUBLIC;",
        ),
        (
            "keel",
            f"{new_role} has USAGE on the schema, {beyond}",
            f"REVOKE USAGE ON SCHEMA keel FROM {new_role};",
        ),
        (
            "keel.task_events (payload)",
            f"{new_role} has SELECT on the column, {beyond}",
            f"REVOKE SELECT (payload) ON TABLE keel.task_events FROM {new_role};",
        ),
        (
            "keel.tasks",
            f"keel_app has SELECT WITH GRANT OPTION on the table, {beyond}",
            "REVOKE SELECT ON TABLE keel.tasks FROM keel_app;",
        ),
        (
            "for role keel_owner in schema keel on tables",
            f"{new_role} has SELECT on the default privileges, {beyond}",
            "ALTER DEFAULT PRIVILEGES FOR ROLE keel_owner IN SCHEMA keel"
            f" REVOKE SELECT ON TABLES FROM {new_role};",
        ),
    }, found


def test_regenerating_a_manifest_rewrites_only_its_list(tmp_path, monkeypatch):
    for rule in MANIFESTS:
        shutil.copy(CHECKS_DIR / f"{rule}.sql", tmp_path)
    monkeypatch.setattr("agentkeel.shipped.CHECKS_DIR", tmp_path)
    for rule in MANIFESTS:
        before = (tmp_path / f"{rule}.sql").read_text()
        rows = manifest(rule)
        write_manifest(rule, [*rows[:2], tuple("it's" for _ in rows[0])])
        assert manifest(rule) == [*rows[:2], tuple("it's" for _ in rows[0])]
        write_manifest(rule, rows)
        assert (tmp_path / f"{rule}.sql").read_text() == before
