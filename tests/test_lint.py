"""`agentkeel lint`: each rule has a passing and a failing fixture, the shipped SQL is clean,
and the acceptance scenario (FORCE dropped, an id-only foreign key, an edited released
migration) is reported with file and line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentkeel.lint import ToolCrashed, ToolMissing, lint
from conftest import REPO, run_agentkeel

BASE = {
    "schema/0001_base.sql": """
create table keel.tenants (
    tenant_id uuid not null,
    constraint tenants_pkey primary key (tenant_id)
);
create table keel.things (
    tenant_id uuid not null,
    thing_id uuid not null,
    note text,
    constraint things_pkey primary key (tenant_id, thing_id),
    constraint things_tenant_fkey foreign key (tenant_id)
    references keel.tenants (tenant_id) on delete cascade
);
create table keel.kinds (
    kind text not null,
    constraint kinds_pkey primary key (kind)
);
""",
    "policies/rls.sql": """
alter table keel.tenants enable row level security;
alter table keel.tenants force row level security;
create policy tenant_isolation on keel.tenants using (tenant_id = keel.current_tenant());
alter table keel.things enable row level security;
alter table keel.things force row level security;
create policy tenant_isolation on keel.things using (tenant_id = keel.current_tenant());
""",
    "functions/error_codes.sql": """
create function keel.error_codes() returns table (sqlstate text) language sql
as $$ select * from (values ('22K01', 'invalid_argument')) as c (sqlstate, name) $$;
""",
    "functions/global_tables.sql": """
create function keel.global_tables() returns setof text language sql immutable
as $$ select t.name from (values ('keel.kinds')) as t (name) $$;
""",
    "functions/touch_thing.sql": """
create function keel.touch_thing(p_tenant_id uuid, p_thing_id uuid) returns keel.things
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    v_now timestamptz := now();
    v_thing keel.things;
begin
    perform keel.require_tenant(p_tenant_id);
    perform 1 from keel.things as t
    where t.tenant_id = p_tenant_id and t.thing_id = p_thing_id for update;
    update keel.things as t set note = v_now::text
    where t.tenant_id = p_tenant_id and t.thing_id = p_thing_id
    returning t.* into v_thing;
    if not found then
        raise exception using errcode = '22K01', message = 'no such thing';
    end if;
    return v_thing;
end;
$$;
""",
}

FAILING = {
    "tenant_keys: primary key": (
        "schema/0002_bad.sql",
        "create table keel.bad (tenant_id uuid not null, bad_id uuid not null,"
        " constraint bad_pkey primary key (bad_id));",
        "tenant_keys",
        "bad_pkey does not include tenant_id",
    ),
    "tenant_keys: unpaired foreign key": (
        "schema/0002_bad.sql",
        "alter table keel.things add constraint things_self_fkey foreign key (tenant_id, thing_id)"
        " references keel.things (thing_id, tenant_id);",
        "tenant_keys",
        "does not pair tenant_id",
    ),
    "tenant_keys: unique index": (
        "schema/0002_bad.sql",
        "create unique index things_thing_idx on keel.things (thing_id);",
        "tenant_keys",
        "things_thing_idx does not include tenant_id",
    ),
    "tenancy: neither tenant nor global": (
        "schema/0002_bad.sql",
        "create table keel.notes (note_id uuid not null, body text,"
        " constraint notes_pkey primary key (note_id));",
        "tenancy",
        "keel.notes has no tenant_id and is not declared global",
    ),
    "tenancy: nullable tenant_id": (
        "schema/0002_bad.sql",
        "create table keel.notes (tenant_id uuid, note_id uuid not null,"
        " constraint notes_pkey unique (tenant_id, note_id));",
        "tenancy",
        "keel.notes.tenant_id must be uuid not null",
    ),
    "tenancy: a global table with tenant_id": (
        "functions/global_tables.sql",
        "create function keel.global_tables() returns setof text language sql immutable"
        " as $$ select t.name from (values ('keel.kinds'), ('keel.things')) as t (name) $$;",
        "tenancy",
        "keel.things has tenant_id but keel.global_tables() lists it as global",
    ),
    "rls: no force": (
        "schema/0002_bad.sql",
        "alter table keel.things no force row level security;",
        "rls",
        "NO FORCE ROW LEVEL SECURITY",
    ),
    "rls: new table without policies": (
        "schema/0002_bad.sql",
        "create table keel.extra (tenant_id uuid not null,"
        " constraint extra_pkey primary key (tenant_id));",
        "rls",
        "keel.extra has tenant_id but row-level security is never enabled",
    ),
    "security_definer": (
        "functions/bad.sql",
        "create function keel.bad() returns int language sql security definer as $$ select 1 $$;",
        "security_definer",
        "keel.bad is SECURITY DEFINER without SET search_path",
    ),
    "errcodes: missing": (
        "functions/bad.sql",
        "create function keel.bad() returns void language plpgsql as $$"
        " begin raise exception 'oops'; end $$;",
        "errcodes",
        "without an ERRCODE",
    ),
    "errcodes: unregistered": (
        "functions/bad.sql",
        "create function keel.bad() returns void language plpgsql as $$"
        " begin raise exception using errcode = '55K99', message = 'x'; end $$;",
        "errcodes",
        "55K99 is not in keel.error_codes()",
    ),
    "citus.set_config": (
        "functions/bad.sql",
        "create function keel.bad() returns void language sql as"
        " $$ select set_config('keel.tenant_id', 'x', true) $$;",
        "citus.set_config",
        "set_config",
    ),
    "citus.node_local": (
        "functions/bad.sql",
        "create function keel.bad() returns void language sql as $$ select pg_advisory_lock(1) $$;",
        "citus.node_local",
        "pg_advisory_lock",
    ),
    "citus.named_constraints": (
        "schema/0002_bad.sql",
        "alter table keel.kinds add check (kind <> '');",
        "citus.named_constraints",
        "every constraint needs a name",
    ),
    "citus.fk_actions": (
        "schema/0002_bad.sql",
        "create table keel.links (tenant_id uuid, thing_id uuid,"
        " constraint links_pkey primary key (tenant_id, thing_id),"
        " constraint links_thing_fkey foreign key (tenant_id, thing_id)"
        " references keel.things (tenant_id, thing_id) on delete set null);",
        "citus.fk_actions",
        "links_thing_fkey",
    ),
    "citus.global_references_tenant": (
        "schema/0002_bad.sql",
        "create table keel.catalog (thing uuid not null, owner uuid not null,"
        " constraint catalog_pkey primary key (thing),"
        " constraint catalog_owner_fkey foreign key (owner) references keel.tenants (tenant_id));",
        "citus.global_references_tenant",
        "keel.catalog (global) references tenant table",
    ),
    "citus.serial": (
        "schema/0002_bad.sql",
        "create table keel.counters (id bigserial, constraint counters_pkey primary key (id));",
        "citus.serial",
        "bigserial",
    ),
    "citus.tenant_filter": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns bigint language plpgsql as $$"
        " begin return (select count(*) from keel.things); end $$;",
        "citus.tenant_filter",
        "keel.things without tenant_id",
    ),
    "citus.tenant_filter: perform": (
        "functions/bad.sql",
        "create function keel.bad(p_thing_id uuid) returns keel.things language plpgsql as $$"
        " declare v_thing keel.things; begin perform 1 from keel.things as t"
        " where t.thing_id = p_thing_id; return v_thing; end $$;",
        "citus.tenant_filter",
        "keel.things without tenant_id",
    ),
    "parse.plpgsql: fallback reported": (
        "functions/bad.sql",
        "create function keel.bad() returns void language plpgsql as $$"
        " begin if true then perform 1; end; end $$;",
        "parse.plpgsql",
        "scanned with regular expressions instead",
    ),
    "citus.insert_select: from a set-returning function (transition_task's outbox)": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid, p_items jsonb) returns void"
        " language plpgsql as $$ begin"
        " insert into keel.things (tenant_id, thing_id, note)"
        " select p_tenant_id, keel.uuid_v7(), m.value ->> 'note'"
        " from jsonb_array_elements(p_items) with ordinality as m (value, position);"
        " end $$;",
        "citus.insert_select",
        "INSERT ... SELECT into keel.things from a set-returning function",
    ),
    "citus.insert_select: not filtered by one tenant": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_ids uuid[]) returns void language plpgsql as $$"
        " begin insert into keel.things (tenant_id, thing_id)"
        " select t.tenant_id, t.thing_id from keel.things as t"
        " where t.tenant_id = any(p_tenant_ids); end $$;",
        "citus.insert_select",
        "not filtered by one tenant_id",
    ),
    "citus.array_element_in_set": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid, p_ids uuid[], p_notes text[]) returns void"
        " language plpgsql as $$ begin update keel.things as t"
        " set note = p_notes[array_position(p_ids, t.thing_id)]"
        " where t.tenant_id = p_tenant_id and t.thing_id = any(p_ids); end $$;",
        "citus.array_element_in_set",
        "takes an array element in its SET",
    ),
    "citus.insert_select: in a migration, without FROM": (
        "schema/0002_bad.sql",
        "insert into keel.things (tenant_id, thing_id) select keel.uuid_v7(), keel.uuid_v7();",
        "citus.insert_select",
        "a SELECT without FROM",
    ),
    "citus.definer_result": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns void language plpgsql"
        " security definer set search_path = pg_catalog, pg_temp as $$"
        " begin delete from keel.things as t where t.tenant_id = p_tenant_id; end $$;",
        "citus.definer_result",
        "writes keel.things and returns nothing",
    ),
    "citus.delegation: tenant argument misnamed": (
        "functions/bad.sql",
        "create function keel.bad(p_owner text, p_tenant uuid) returns void language plpgsql"
        " as $$ begin perform 1; end $$;",
        "citus.delegation",
        "takes the tenant as p_tenant",
    ),
    "citus.delegation: p_tenant_id not first": (
        "functions/bad.sql",
        "create function keel.bad(p_owner text, p_tenant_id uuid) returns void"
        " language plpgsql as $$ begin perform 1; end $$;",
        "citus.delegation",
        "p_tenant_id is not the first argument",
    ),
    "citus.worker_tables": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns bigint language plpgsql as $$"
        " begin return (select count(*) from keel.migration_history as h); end $$;",
        "citus.worker_tables",
        "reads keel.migration_history, which no migration creates",
    ),
    "citus.set_local_autocommit": (
        "functions/bad.sql",
        "create function keel.bad() returns bigint language plpgsql as $$"
        " begin execute 'set local keel.scan_all_tenants = on'; return 1; end $$;",
        "citus.set_local_autocommit",
        "keel.bad runs SET LOCAL itself",
    ),
    "citus.set_local_autocommit: format()": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns void language plpgsql as $$"
        " begin execute format('SET LOCAL keel.tenant_id = %L', p_tenant_id); end $$;",
        "citus.set_local_autocommit",
        "keel.bad runs SET LOCAL itself",
    ),
    "citus.set_local_autocommit: a SECURITY DEFINER entry point, even when called": (
        "functions/bad.sql",
        "create function keel.bad() returns void language plpgsql security definer"
        " set search_path = pg_catalog, pg_temp as $$"
        " begin set local keel.scan_all_tenants = on; end $$;"
        " create function keel.caller() returns void language plpgsql as $$"
        " begin perform keel.bad(); end $$;",
        "citus.set_local_autocommit",
        "keel.bad runs SET LOCAL itself",
    ),
    "citus.require_tenant: never called": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid, p_thing_id uuid) returns keel.things"
        " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        " declare v_thing keel.things; begin select t.* into v_thing from keel.things as t"
        " where t.tenant_id = p_tenant_id and t.thing_id = p_thing_id; return v_thing; end $$;",
        "citus.require_tenant",
        "reaches keel objects before it calls keel.require_tenant(p_tenant_id)",
    ),
    "citus.require_tenant: called after another keel function": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns keel.things"
        " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        "\ndeclare\n    v_thing keel.things;\nbegin\n"
        "    v_thing := keel.touch_thing(p_tenant_id, null);\n"
        "    perform keel.require_tenant(p_tenant_id);\n    return v_thing;\nend $$;",
        "citus.require_tenant",
        "reaches keel objects before it calls keel.require_tenant(p_tenant_id)",
    ),
    "citus.require_tenant: another tenant verified": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid, p_other uuid) returns uuid"
        " language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        " begin return keel.require_tenant(p_other); end $$;",
        "citus.require_tenant",
        "keel.bad is SECURITY DEFINER, takes p_tenant_id",
    ),
    "citus.row_lock": (
        "functions/bad.sql",
        "create function keel.bad(p_ids uuid[]) returns void language plpgsql as $$"
        " begin perform 1; select 1 from keel.things as t where t.tenant_id = any(p_ids)"
        " for update skip locked; end $$;",
        "citus.row_lock",
        "more than one tenant",
    ),
    "citus.volatile": (
        "functions/bad.sql",
        "create function keel.bad(p_tenant_id uuid) returns void language plpgsql as $$"
        " begin update keel.things as t set note = now()::text"
        " where t.tenant_id = p_tenant_id; end $$;",
        "citus.volatile",
        "now() inside UPDATE",
    ),
}


def tree(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    root = tmp_path / "sql"
    for name, text in {**BASE, **(extra or {})}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text.lstrip())
    return root


def static(root: Path) -> list:
    return lint([root / "schema", root / "functions", root / "policies"], root, tools=False)


def test_the_passing_fixture_is_clean_for_every_rule(tmp_path):
    assert static(tree(tmp_path)) == []


@pytest.mark.parametrize("case", sorted(FAILING))
def test_each_rule_catches_its_failing_fixture(tmp_path, case):
    file, text, rule, message = FAILING[case]
    findings = static(tree(tmp_path, {file: text}))
    matching = [f for f in findings if f.rule == rule and message in f.message]
    assert matching, [f.human() for f in findings]
    assert all(f.file == file or f.rule in ("rls", "tenancy") for f in matching)


def test_a_waiver_names_its_rule(tmp_path):
    file, text, _, _ = FAILING["citus.tenant_filter"]
    waived = "-- agentkeel:allow citus.tenant_filter (a deliberate cross-tenant read)\n" + text
    assert static(tree(tmp_path, {file: waived})) == []


def test_sqlfluff_and_squawk_findings_are_reported(tmp_path):
    root = tree(
        tmp_path, {"schema/0002_risky.sql": "ALTER TABLE keel.things ADD COLUMN y int not null;\n"}
    )
    shutil.copy(REPO / ".sqlfluff", root / ".sqlfluff")
    shutil.copy(REPO / ".squawk.toml", root / ".squawk.toml")
    findings = lint([root / "schema"], root)
    rules = {f.rule for f in findings if f.file == "schema/0002_risky.sql"}
    assert "sqlfluff.CP01" in rules  # upper-case keywords
    assert "squawk.adding-required-field" in rules
    squawked = [f for f in findings if f.rule.startswith("squawk.")]
    assert [f.line for f in squawked] == [1], [f.human() for f in squawked]  # not 0


def test_squawk_findings_carry_real_lines_and_agentkeel_hints(tmp_path):
    migration = (
        "-- a comment on line 1\n"
        "\n"
        "create index things_note_idx on keel.things (note);\n"  # line 3
    )
    root = tree(tmp_path, {"schema/0002_index.sql": migration})
    shutil.copy(REPO / ".squawk.toml", root / ".squawk.toml")
    findings = [f for f in lint([root / "schema"], root) if f.rule.startswith("squawk.")]
    index = [f for f in findings if f.rule == "squawk.require-concurrent-index-creation"]
    assert [f.line for f in index] == [3], [f.human() for f in findings]
    assert "-- agentkeel:no-transaction" in index[0].hint
    assert "(hint: create index concurrently" in index[0].human()

    # Marked no-transaction, a concurrent index is what agentkeel migrate can run.
    marked = (
        "-- agentkeel:no-transaction\n"
        "create index concurrently things_note_idx on keel.things (note);\n"
    )
    root = tree(tmp_path / "marked", {"schema/0002_index.sql": marked})
    shutil.copy(REPO / ".squawk.toml", root / ".squawk.toml")
    rules = {f.rule for f in lint([root / "schema"], root)}
    assert not {r for r in rules if r.startswith("squawk.")}, rules


def _only_on_path(tmp_path, monkeypatch, **scripts):
    """PATH holds just these fake tools; the interpreter's own bin/ is not searched either."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body + "\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-interpreter-bin" / "python"))


@pytest.mark.parametrize("missing", ["sqlfluff", "squawk"])
def test_a_missing_tool_is_an_error_not_an_empty_report(tmp_path, monkeypatch, missing):
    root = tree(tmp_path)
    present = {"sqlfluff": "echo '[]'", "squawk": "echo '[]'"}
    del present[missing]
    _only_on_path(tmp_path, monkeypatch, **present)
    with pytest.raises(ToolMissing, match=rf"{missing} is not installed") as raised:
        lint([root / "schema", root / "functions"], root)
    assert raised.value.tool == missing
    assert static(root) == []  # --static-only needs neither


@pytest.mark.parametrize("crashing", ["sqlfluff", "squawk"])
def test_a_crashing_tool_is_an_error_not_findings(tmp_path, monkeypatch, crashing):
    root = tree(tmp_path)
    scripts = {"sqlfluff": "echo '[]'", "squawk": "echo '[]'"}
    scripts[crashing] = "echo 'thread main panicked' >&2; exit 2"
    _only_on_path(tmp_path, monkeypatch, **scripts)
    with pytest.raises(ToolCrashed, match=rf"{crashing} failed \(exit 2\).*panicked"):
        lint([root / "schema", root / "functions"], root)


def test_the_shipped_sql_is_clean():
    result = run_agentkeel("lint", "--format", "json")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout) == []


def test_an_insert_select_from_a_colocated_table_of_one_tenant_passes(tmp_path):
    text = (
        "create function keel.copy_thing(p_tenant_id uuid, p_thing_id uuid) returns void"
        " language plpgsql as $$ begin"
        " insert into keel.things (tenant_id, thing_id, note)"
        " select t.tenant_id, keel.uuid_v7(), t.note from keel.things as t"
        " where t.tenant_id = p_tenant_id and t.thing_id = p_thing_id;"
        " insert into keel.things (tenant_id, thing_id) values (p_tenant_id, p_thing_id);"
        " end $$;"
    )
    assert static(tree(tmp_path, {"functions/copy_thing.sql": text})) == []


def test_the_shipped_outbox_rows_are_single_row_inserts():
    """CITUS.md rule 28: a transition's outbox messages are written each with its own
    INSERT ... VALUES; an INSERT ... SELECT from jsonb_array_elements (what failed on the
    cluster) would be flagged by citus.insert_select, as the fixture above shows."""
    findings = lint([REPO / "schema", REPO / "functions", REPO / "policies"], REPO, tools=False)
    assert findings == []
    text = (REPO / "functions" / "write_outbox.sql").read_text()
    insert = text.index("insert into keel.outbox")
    assert "values (" in text[insert : text.index(";", insert)]


def test_the_citus_variants_are_clean_beside_the_shipped_sql():
    """The functions `agentkeel distribute` installs on Citus follow the same rules (their
    one cross-tenant scan waived in the file, with its reason)."""
    paths = [REPO / d for d in ("schema", "functions", "policies", "tools/agentkeel/citus")]
    assert lint(paths, REPO, tools=False) == []


def test_a_set_local_in_a_helper_that_functions_call_passes(tmp_path):
    """Rule 31: a SET LOCAL run inside a query of another function (PERFORM) is propagated
    by Citus in autocommit too, so a helper that other functions call is not flagged."""
    text = (
        "create function keel.enter(p_verified uuid) returns void language plpgsql as $$"
        " begin execute format('set local keel.tenant_id = %L', p_verified); end $$;"
        " create function keel.use_it(p_tenant_id uuid) returns void language plpgsql as $$"
        " begin perform keel.enter(p_tenant_id); end $$;"
    )
    assert static(tree(tmp_path, {"functions/enter.sql": text})) == []


def test_set_config_passes_only_in_a_function_file_that_has_a_citus_variant(tmp_path):
    """The context helpers use set_config on PostgreSQL (no statement to parse on every
    call); `agentkeel distribute` replaces each with its SET LOCAL variant of the same file
    name. The same set_config in a file without a shipped variant is still reported."""
    text = (
        "create function keel.set_claim_scan(p_on boolean) returns void language sql as"
        " $$ select set_config('keel.scan_all_tenants', 'on', true) $$;"
    )
    assert static(tree(tmp_path, {"functions/set_claim_scan.sql": text})) == []
    findings = static(tree(tmp_path, {"functions/set_claim_scans.sql": text}))
    assert [f.rule for f in findings] == ["citus.set_config"]


def test_the_acceptance_scenario_is_reported_with_file_and_line(tmp_path):
    work = tmp_path / "repo"
    for name in ("schema", "functions", "policies"):
        shutil.copytree(REPO / name, work / name)
    for name in (".sqlfluff", ".squawk.toml"):
        shutil.copy(REPO / name, work / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "."], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "release"], cwd=work, check=True)
    subprocess.run([*git, "tag", "v0.1.0"], cwd=work, check=True)
    # 1. FORCE ROW LEVEL SECURITY dropped (from the catalog loop that applies it).
    rls = work / "policies" / "04_row_level_security.sql"
    lines = [ln for ln in rls.read_text().splitlines() if "force row level security" not in ln]
    rls.write_text("\n".join(lines) + "\n")
    # 2. A foreign key without tenant_id.
    (work / "schema" / "0013_notes.sql").write_text(
        "create table keel.notes (\n    tenant_id uuid not null,\n    note_id uuid not null,\n"
        "    task_id uuid,\n    constraint notes_pkey primary key (tenant_id, note_id),\n"
        "    constraint notes_task_fkey foreign key (task_id) references keel.tasks (task_id)\n);\n"
    )
    # 3. An edit to a released migration.
    released = work / "schema" / "0003_tenants.sql"
    released.write_text(released.read_text() + "\n-- edited after release\n")

    result = run_agentkeel("lint", "schema", "functions", "policies", "--format", "json", cwd=work)
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)
    found = {(f["file"], f["rule"]) for f in findings}
    assert ("schema/0006_tasks.sql", "rls") in found  # keel.tasks is no longer forced
    assert ("schema/0013_notes.sql", "tenant_keys") in found
    assert ("schema/0003_tenants.sql", "released_migration") in found
    assert all(f["line"] >= 1 for f in findings)
    human = run_agentkeel("lint", "schema", "functions", "policies", cwd=work)
    assert (
        "schema/0013_notes.sql:1: tenant_keys: keel.notes: foreign key notes_task_fkey"
        in human.stdout
    )
    github = run_agentkeel("lint", "schema", "--format", "github", "--static-only", cwd=work)
    assert "::error file=schema/0013_notes.sql,line=1,title=tenant_keys::" in github.stdout


def test_function_body_findings_carry_the_line_of_the_statement(tmp_path):
    text = (
        "create function keel.bad(p_tenant_id uuid) returns keel.things\n"  # line 1
        "language plpgsql as $$\n"
        "declare\n"
        "    v_thing keel.things;\n"
        "begin\n"  # line 5
        "    perform keel.touch_thing(p_tenant_id, p_tenant_id);\n"
        "    perform 1\n"  # line 7: the PERFORM the old regex scan never saw
        "    from keel.things as t\n"
        "    where t.note = 'keel.things';\n"
        "    return v_thing;\n"
        "end;\n"
        "$$;\n"
    )
    findings = static(tree(tmp_path, {"functions/bad.sql": text}))
    assert [(f.file, f.line, f.rule) for f in findings] == [
        ("functions/bad.sql", 7, "citus.tenant_filter")
    ], [f.human() for f in findings]


def test_keel_qualified_types_do_not_stop_the_plpgsql_parser():
    from agentkeel.lint.core import load
    from agentkeel.lint.plpgsql import functions

    files, _ = load([REPO / "functions"], REPO)
    bodies = [b for f in files for b in functions(f)]
    assert bodies and all(b.language != "plpgsql" or not b.fallback for b in bodies)
    transition = next(b for b in bodies if b.name == "keel.transition_task")
    kinds = {s.plpgsql for s in transition.statements}
    assert {"perform", "execsql", "assign", "if"} <= kinds


def test_the_global_tables_come_from_keel_global_tables_even_when_only_schema_is_linted(tmp_path):
    root = tree(tmp_path)

    def tenancy() -> list:
        return [f for f in lint([root / "schema"], root, tools=False) if f.rule == "tenancy"]

    assert tenancy() == []
    (root / "functions" / "global_tables.sql").unlink()
    findings = tenancy()
    assert [(f.file, f.rule) for f in findings] == [("schema/0001_base.sql", "tenancy")]
    assert "there is no keel.global_tables()" in findings[0].message


def test_the_shipped_global_tables_are_every_keel_table_without_tenant_id():
    from agentkeel.lint.core import load, tables
    from agentkeel.lint.tenancy import global_tables

    files, _ = load([REPO / "schema", REPO / "functions"], REPO)
    declared = global_tables(files, REPO)
    without_tenant = {t.name for t in tables(files).values() if not t.tenant}
    assert declared == without_tenant | {"keel.migration_history"}  # created by the migrator
