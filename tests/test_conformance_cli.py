"""`agentkeel conformance`: runs the suite anywhere, reports by guarantee, catches broken schemas,
and leaves nothing behind."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql
from rich.console import Console

from agentkeel.exitcodes import ExitCode
from agentkeel_conformance.mutations import BY_NAME, Mutation
from agentkeel_conformance.plugin import guarantee_table
from conftest import REPO, run_agentkeel


def row_counts(dsn: str) -> dict[str, int]:
    """Rows of every table in keel, found in the catalog: a table added later is counted
    without anyone remembering to list it."""
    with psycopg.connect(dsn) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "select c.relname from pg_catalog.pg_class c"
                " join pg_catalog.pg_namespace n on n.oid = c.relnamespace"
                " where n.nspname = 'keel' and c.relkind in ('r', 'p') order by 1"
            )
        ]
        return {
            t: conn.execute(
                sql.SQL("select count(*) from keel.{}").format(sql.Identifier(t))
            ).fetchone()[0]
            for t in tables
        }


def ran_clean(verdict: str) -> bool:
    """Passed, or partial: some tests ran and none failed (the rest skipped, with reasons)."""
    return verdict == "passed" or re.fullmatch(r"partial \(\d+ of \d+ ran\)", verdict) is not None


def verdicts(output: str) -> dict[str, str]:
    """guarantee id -> result column of the printed table."""
    found = {}
    for line in output.splitlines():
        match = re.match(
            r"^│ (G\d+)\s+│.*│ (passed|FAILED|skipped|not covered|not selected"
            r"|partial \(\d+ of \d+ ran\))\s+│$",
            line,
        )
        if match:
            found[match[1]] = match[2]
    return found


def test_the_suite_passes_on_a_migrated_database_and_leaves_nothing_behind(migrated_db, tmp_path):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "insert into keel.tenants (tenant_id, name) values (keel.uuid_v7(), 'users own data')"
        )
        conn.execute("create schema app")
        conn.execute("create table app.orders as select generate_series(1, 50) as id")
    before = row_counts(migrated_db)
    junit = tmp_path / "junit.xml"
    result = run_agentkeel("conformance", "--dsn", migrated_db, "-q", f"--junitxml={junit}")
    assert result.returncode == 0, result.stdout[-3000:]
    table = verdicts(result.stdout)
    covered = {g: v for g, v in table.items() if v != "not covered"}
    # partial: the chaos test restarts the server, so it runs on the embedded cluster only
    assert all(ran_clean(v) for v in covered.values()), table
    assert {"G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9", "G10", "G11"} <= set(covered)
    assert row_counts(migrated_db) == before
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select count(*) from app.orders").fetchone() == (50,)
        leftover = conn.execute("select count(*) from pg_roles where rolname like 'akc%'")
        assert leftover.fetchone() == (0,), "login roles were left behind"
    properties = ET.parse(junit).getroot().findall(".//property[@name='guarantee']")
    assert {p.get("value") for p in properties} >= {"G2", "G3", "G5"}


def test_the_suite_keeps_the_signing_keys_the_database_had(migrated_db):
    """A database with an active signing key keeps exactly its keys: the suite's mints use
    it, and nothing is deleted (the test above: with none, the suite's own key goes)."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        version = conn.execute("select keel.rotate_tenant_token_key()").fetchone()[0]
        keys = conn.execute("select * from keel.tenant_token_keys order by 1").fetchall()
    result = run_agentkeel("conformance", "--dsn", migrated_db, "-q", "-k", "expired_token")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select * from keel.tenant_token_keys order by 1").fetchall() == keys
        assert [k[0] for k in keys] == [version]


def test_the_callers_pytest_configuration_does_not_leak_in(migrated_db, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    (tmp_path / "conftest.py").write_text("raise RuntimeError('a user conftest was imported')\n")
    result = run_agentkeel(
        "conformance", "--dsn", migrated_db, "-q", "-k", "contiguous", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


def test_plain_pytest_with_the_plugin_runs_the_suite(migrated_db):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "agentkeel_conformance.plugin",
            "--pyargs",
            "agentkeel_conformance",
            "--keel-dsn",
            migrated_db,
            "-q",
            "-k",
            "G3 or transitions",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert verdicts(result.stdout)["G3"] == "passed"


def test_an_unmigrated_database_is_refused_with_a_hint(db):
    result = run_agentkeel("conformance", "--dsn", db, "-q")
    assert result.returncode == ExitCode.SCHEMA_MISSING
    assert "agentkeel migrate up" in result.stdout + result.stderr


def break_function(dsn: str, mutation: Mutation) -> None:
    """Install the deliberately broken variant of one repeatable file (a function, or a
    policies/ file)."""
    source = mutation.apply((REPO / mutation.path).read_text())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(source.encode())


# Each planted bug (agentkeel_conformance.mutations) in a database of its own: the suite
# must report the guarantee the mutation breaks, naming the test that caught it; only
# tests of that guarantee and of the ones it lists in `also` may fail. By default (and in
# CI) a mutation runs only the tests of those guarantees (`--guarantee G5,G1,G2`): it must
# still be caught, by the named test, under its guarantee. With AGENTKEEL_MUTATIONS_FULL=1
# each runs the whole suite, which also checks that no test of another guarantee fails
# (about 16 minutes instead of 7 with -n 2).
MUTATIONS_FULL = os.environ.get("AGENTKEEL_MUTATIONS_FULL") == "1"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_suite_catches_a_broken_function(migrated_db, name):
    mutation = BY_NAME[name]
    break_function(migrated_db, mutation)
    guarantees = (mutation.guarantee, *mutation.also)
    # -n 2: the suite waits more than it computes (idle-timeout, race and relay tests)
    selection = [] if MUTATIONS_FULL else ["--guarantee", ",".join(guarantees)]
    result = run_agentkeel("conformance", "--dsn", migrated_db, "-q", "-n", "2", *selection)
    assert result.returncode == 1, result.stdout[-3000:]
    table = verdicts(result.stdout)
    assert table[mutation.guarantee] == "FAILED"
    assert re.search(
        rf"^{mutation.guarantee} FAILED \S*::{mutation.caught_by}\b", result.stdout, re.MULTILINE
    )
    if MUTATIONS_FULL:
        # Only tests that prove these guarantees (some prove several) may fail: each failed
        # test (module::function) with every guarantee it was reported under.
        failed: dict[str, set[str]] = {}
        for gid, test in re.findall(
            r"^(G\d+) FAILED (\S+?::[^\s\[:]+)", result.stdout, flags=re.MULTILINE
        ):
            failed.setdefault(test, set()).add(gid)
        assert failed and all(gids & set(guarantees) for gids in failed.values()), failed


def test_the_embedded_default_runs_with_no_dsn():
    result = run_agentkeel("conformance", "-q", "-k", "contiguous or two_claimers or concurrent")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    table = verdicts(result.stdout)
    assert table["G5"] == "passed"
    # -k chose the tests: what none of them proves was not selected, not "not covered".
    assert table["G9"] == table["G10"] == "not selected"
    assert "-k or -m selected some of the tests" in result.stdout


def test_readme_commands_are_the_ones_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = (
        re.findall(r"```(?:sh|bash)\n(.*?)```", readme, flags=re.DOTALL)[0].strip().splitlines()
    )
    assert len(commands) == 2
    for command in commands:
        assert command in ci, f"README command not run by .ci/run: {command}"
    assert Path(REPO / ".ci" / "run").exists()


def test_read_only_runs_only_the_catalog_checks_and_writes_nothing(migrated_db):
    before = row_counts(migrated_db)
    result = run_agentkeel("conformance", "--dsn", migrated_db, "--read-only", "-q")
    assert result.returncode == 0, result.stdout[-3000:]
    table = verdicts(result.stdout)
    assert ran_clean(table["G1"]) and (table["G12"], table["G2"]) == ("passed", "not covered")
    assert row_counts(migrated_db) == before


def test_read_only_as_an_agent_login_is_refused_before_any_test(migrated_db):
    """The catalog checks call functions an agent login may not: refused up front with the
    roles that can run them (exit 7), not reported as G1 and G7 failures."""
    role = f"akt_ro_agent_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(f'create role "{role}" login in role keel_agent')
    try:
        agent = conninfo.make_conninfo(migrated_db, user=role)
        result = run_agentkeel("conformance", "--dsn", agent, "--read-only", "-q")
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(f'drop role "{role}"')
    assert result.returncode == ExitCode.PERMISSION, result.stdout[-2000:] + result.stderr
    assert "keel_app, keel_worker, keel_owner or keel_auditor" in result.stderr
    assert "FAILED" not in result.stdout


def test_guarantee_runs_only_the_tests_of_the_guarantees_named(migrated_db):
    result = run_agentkeel("conformance", "--dsn", migrated_db, "--guarantee", "g4,G9", "-q")
    assert result.returncode == 0, result.stdout[-3000:]
    table = verdicts(result.stdout)
    assert ran_clean(table["G4"]) and ran_clean(table["G9"]), table
    assert table["G1"] == table["G7"] == "not selected"
    assert re.search(r"^\d+ passed", result.stdout.splitlines()[-1])
    assert "deselected" in result.stdout.splitlines()[-1]


def test_a_guarantee_with_skipped_tests_reads_partial_and_strict_fails_the_run(migrated_db):
    """A selected test of G3 skips (the chaos test needs the embedded cluster): the table
    says partial, not passed, and --strict makes the run fail."""
    selection = ("--guarantee", "G3", "-k", "chaos or a_stale_version_is_refused", "-q")
    result = run_agentkeel("conformance", "--dsn", migrated_db, *selection)
    assert result.returncode == 0, result.stdout[-3000:]
    said = verdicts(result.stdout)["G3"]
    assert re.fullmatch(r"partial \((\d+) of (\d+) ran\)", said), said
    assert "--strict" not in result.stdout
    strict = run_agentkeel("conformance", "--dsn", migrated_db, "--strict", *selection)
    assert strict.returncode == 1, strict.stdout[-3000:]
    assert f"--strict: G3 {said}" in strict.stdout
    assert "failed" not in strict.stdout.splitlines()[-1]  # no test failed; the verdict did


def test_an_unknown_guarantee_is_a_usage_error_before_any_test(migrated_db):
    for spelling in (["--guarantee", "G13"], ["--guarantee=G1,G13"]):
        result = run_agentkeel("conformance", "--dsn", migrated_db, *spelling, "-q")
        assert result.returncode == 2
        # The CLI's one error line, not pytest's "ERROR:"; and pytest never started.
        assert result.stderr.startswith("agentkeel: error: --guarantee: unknown guarantee G13")
        assert result.stdout == ""


def test_a_guarantee_without_read_only_tests_says_the_selection_matched_nothing(migrated_db):
    result = run_agentkeel(
        "conformance", "--dsn", migrated_db, "--read-only", "--guarantee", "G5", "-q"
    )
    assert result.returncode == 2
    assert "no test ran: the selection (-k, -m, --read-only, --guarantee)" in result.stderr


def test_a_drifted_database_fails_g12(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "update keel.migration_history set checksum = repeat('0', 64)"
            " where name = 'schema/0006_tasks.sql'"
        )
    result = run_agentkeel("conformance", "--dsn", migrated_db, "--read-only", "-q")
    assert result.returncode == 1
    assert verdicts(result.stdout)["G12"] == "FAILED"
    assert "drift: schema/0006_tasks.sql" in result.stdout


def test_an_application_login_needs_an_owner_dsn_for_cleanup(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("create role ak_app_only login password 'pw' in role keel_app")
    try:
        app_dsn = conninfo.make_conninfo(migrated_db, user="ak_app_only", password="pw")
        alone = run_agentkeel("conformance", "--dsn", app_dsn, "-q", "-k", "g3")
        assert alone.returncode == 0, alone.stdout[-2000:]
        assert "needs a member of keel_owner" in alone.stdout
        assert re.search(r"\d+ skipped", alone.stdout)
        with_owner = run_agentkeel(
            "conformance", "--dsn", app_dsn, "--owner-dsn", migrated_db, "-q", "-k", "g3"
        )
        assert with_owner.returncode == 0, with_owner.stdout[-2000:]
        assert verdicts(with_owner.stdout)["G3"] == "passed"
        assert row_counts(migrated_db)["tenants"] == 0
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute("drop role ak_app_only")


def test_testcontainers_without_docker_skips_with_the_reason():
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        pass
    else:
        pytest.skip("a Docker daemon answers here: the skip path cannot be shown")
    result = run_agentkeel("conformance", "--testcontainers", "-q", "-k", "contiguous")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "no Docker daemon answers" in result.stdout


def test_an_experiment_that_could_not_be_set_up_reads_inconclusive_not_failed(
    migrated_db, tmp_path
):
    """harness.inconclusive: the crash test on a machine too busy for its crash to cut a
    call short says so (INCONCLUSIVE, the reason), and its guarantee reads partial."""
    (tmp_path / "test_experiment.py").write_text(
        "import pytest\n"
        "from agentkeel_conformance.harness import inconclusive\n\n"
        "@pytest.mark.guarantee('G2')\n"
        "def test_crash():\n"
        "    inconclusive('the crash cut no call short')\n\n"
        "@pytest.mark.guarantee('G2')\n"
        "def test_ok():\n"
        "    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "AGENTKEEL_DSN")}
    plugin = ["-p", "no:cacheprovider", "-p", "agentkeel_conformance.plugin"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin,
            "-q",
            "--keel-dsn",
            migrated_db,
            "test_experiment.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "G2 INCONCLUSIVE test_experiment.py::test_crash: the crash cut no call short" in (
        result.stdout
    )
    assert verdicts(result.stdout)["G2"] == "partial (1 of 2 ran)"


def test_a_long_verdict_stays_on_one_line_of_the_table():
    """At the narrowest width the suite prints (100 columns, not a terminal), the title
    wraps, never a verdict: 'partial (104 of' over '105 ran)' was read as no verdict."""
    results = {
        "G1": {f"t{i}": ("passed", "") for i in range(1003)} | {"s": ("skipped", "why")},
        "G7": {"t": ("passed", "")},
    }
    rendered = io.StringIO()
    Console(file=rendered, width=100, force_terminal=False).print(guarantee_table(results))
    table = verdicts(rendered.getvalue())
    assert table["G1"] == "partial (1003 of 1004 ran)", rendered.getvalue()
    assert table["G7"] == "passed"
