"""`agentkeel conformance`: runs the suite anywhere, reports by guarantee, catches broken schemas,
and leaves nothing behind."""

from __future__ import annotations

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

from agentkeel.exitcodes import ExitCode
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
    assert {"G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9"} <= set(covered)
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


def break_function(dsn: str, file: str, *mutations: tuple[str, str, int]) -> None:
    """Install a deliberately broken variant of one repeatable file (a function, or a
    policies/ file): (pattern, replacement, count)."""
    source = (REPO / (file if "/" in file else f"functions/{file}")).read_text()
    for pattern, replacement, expected in mutations:
        source, count = re.subn(pattern, replacement, source, flags=re.DOTALL)
        assert count == expected, f"the mutation {pattern!r} did not apply to {file}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(source.encode())


# Deliberately broken variants of one function (or policy file) each: the suite must
# report the guarantee the mutation breaks, naming a test that caught it. A guarantee
# given as "G5+G1+G2" must fail (G5), and only tests of those guarantees may fail.
# By default (and in CI) a mutation runs only the tests of its guarantees
# (`--guarantee G5,G1,G2`): it must still be caught, by the named test, under its first
# guarantee. With AGENTKEEL_MUTATIONS_FULL=1 each runs the whole suite, which also checks
# that no test of another guarantee fails (about 16 minutes instead of 7 with -n 2).
MUTATIONS_FULL = os.environ.get("AGENTKEEL_MUTATIONS_FULL") == "1"
MUTATIONS = {
    "G1: plain_tenant_id, trusted_session trusts every login's plain tenant id": (
        "trusted_session.sql",
        [(r"pg_catalog.pg_has_role\(session_user, 'keel_app', 'member'\)", "true", 1)],
        # The agent's token is then ignored too: tests of other guarantees that act as an
        # agent login (the actor test, the fairness attack) fail with it.
        "G1+G3+G5",
        "test_a_plain_tenant_id_is_ignored_for_the_agent",
    ),
    "G1: adopt_any_tenant, require_tenant lets a trusted call leave its context": (
        "require_tenant.sql",
        [
            (
                r"if v_context is null and keel.trusted_session\(\) then",
                "if keel.trusted_session() then",
                1,
            )
        ],
        "G1",
        "test_the_app_without_context_sees_nothing_and_acts_only_in_the_tenant_it_names",
    ),
    "G1: session_context, current_tenant honours a context left by an earlier transaction": (
        "current_tenant.sql",
        [
            (
                r"pg_catalog.current_setting\('keel.context_stamp', true\)\s+"
                r"is distinct from keel.context_stamp\(\)",
                "false",
                1,
            )
        ],
        "G1",
        "test_a_session_level_app_context_is_ignored_by_later_transactions",
    ),
    "G1: agent_plain_context, an agent's plain tenant id is honoured like a trusted one": (
        "trusted_session.sql",
        [
            (
                r"(pg_catalog.pg_has_role\(session_user, 'keel_app', 'member'\))",
                r"\1 or pg_catalog.pg_has_role(session_user, 'keel_agent', 'member')",
                1,
            )
        ],
        "G1",
        "test_a_tenant_id_an_agent_plants_gives_it_nothing",
    ),
    "G9: numbers_unchecked, numbers no double holds are stored": (
        "check_payload.sql",
        [
            (
                r"@\.abs\(\) > 1\.7976931348623157e308 \|\| @\.abs\(\) < 2\.2250738585072014e-308",
                "@.abs() < 0",
                1,
            )
        ],
        "G9",
        "test_numbers_no_double_can_hold_are_refused",
    ),
    "G1: token_login_unchecked, a token bound to a login verifies for any login": (
        "verify_tenant_token.sql",
        [(r"and (v_parts\[5\] <> encode\(convert_to\(session_user)", r"and false and \1", 1)],
        "G1",
        "test_a_token_bound_to_one_agent_login_is_refused_to_another",
    ),
    "G1: token_snapshot_isolation, tokens verify in a snapshot that hides retirements": (
        "verify_tenant_token.sql",
        [(r"current_setting\('transaction_isolation'\) <> 'read committed'", "false", 1)],
        "G1",
        "test_a_key_retired_inside_an_open_transaction_stops_its_tokens_there",
    ),
    "G1: expiry_at_transaction_start, a token is judged at the transaction's start": (
        "verify_tenant_token.sql",
        [(r"<= clock_timestamp\(\) then  -- at call time", "<= now() then", 1)],
        "G1",
        "test_a_token_expiring_inside_an_open_transaction_stops_working_there",
    ),
    "G5: recover_ignores_context, the recoverer takes other tenants' tasks in a context": (
        "recover_stale_tasks.sql",
        [
            (
                r"lock_task_to_recover\(v_now, p_workflow, v_after, v_context\)",
                "lock_task_to_recover(v_now, p_workflow, v_after)",
                1,
            )
        ],
        "G5",
        "test_a_transaction_acting_for_a_tenant_recovers_only_that_tenants_tasks",
    ),
    "G5: recover_max_raisable, a caller raises the maximum of recovery attempts": (
        "recover_stale_tasks.sql",
        [
            (
                r"v_max := least\(coalesce\(v_max, keel\.max_recovery_attempts\(\)\), ",
                "v_max := coalesce(v_max, keel.max_recovery_attempts()) + 0 * least(0, ",
                1,
            )
        ],
        "G5",
        "test_a_recoverer_cannot_raise_the_maximum_of_recovery_attempts",
    ),
    "G6: claim_token_sequential, the next claim token is the previous one plus one": (
        "claim_locked_message.sql",
        [(r"claim_token = v_token,", "claim_token = o.claim_token + 1,", 1)],
        "G6",
        "test_a_live_claim_cannot_be_guessed_by_another_relay",
    ),
    "G6: attempts_at_claim, a claim spends an attempt as it did before migration 0034": (
        "claim_locked_message.sql",
        [(r"claims = o\.claims \+ 1", "claims = o.claims + 1, attempts = o.attempts + 1", 1)],
        "G6",
        "test_a_crash_between_publish_and_ack_spends_no_attempt",
    ),
    "G6: sweep_blind, the relay's sweep promotes no held message": (
        "promote_outbox_heads.sql",
        [
            (
                r"if v_stuck\[i\] and keel\.promote_outbox_head",
                "if false and keel.promote_outbox_head",
                1,
            )
        ],
        "G6",
        "test_a_message_written_while_the_one_ahead_of_it_is_acked_is_claimed_after_the_sweep",
    ),
    "G6: claim_trusts_held, the claim takes every message not held, unchecked": (
        "claim_outbox.sql",
        [(r"\(\n                    o\.message_key is null.*?\) as head", "true as head", 1)],
        "G6",
        "test_two_first_messages_of_a_key_written_at_once_are_claimed_one_at_a_time",
    ),
    "G3: batch_bytes_unchecked, a batch of any size in bytes is run": (
        "check_batch.sql",
        [(r"if pg_column_size\(p_items\) > v_bytes then", "if false then", 1)],
        "G3",
        "test_a_batch_over_the_byte_budget_is_refused_whole",
    ),
    "G3: payload_before_lookup, payloads are checked before the task is looked up": (
        "transition_task.sql",
        [
            (
                r"(    v_task := keel\.lock_task\(p_tenant_id, p_task_id\);)",
                "    perform keel.check_payload('event payload', p_payload,"
                " 'max_event_payload_bytes');\n\\1",
                1,
            )
        ],
        "G3",
        "test_a_missing_task_is_refused_before_its_payload_is_read",
    ),
    "G9: transition_messages_unbounded, a transition writes any number of messages": (
        "transition_task.sql",
        [(r"if jsonb_array_length\(p_outbox\) > v_max_messages then", "if false then", 1)],
        "G9",
        "test_a_transition_writes_at_most_the_set_number_of_outbox_messages",
    ),
    "G2: hash_unchecked, reserve without the hash comparison": (
        "reserve_operation.sql",
        [(r"if v_differs is not null then.*?end if;", "-- conflict check removed", 1)],
        "G2",
        "test_a_reused_key_with_different_input_conflicts",
    ),
    "G3: version_unchecked, transition without the version check": (
        "transition_task.sql",
        [(r"if v_task.state_version <> p_expected_version then.*?end if;", "", 1)],
        "G3",
        "test_a_stale_version_is_refused",
    ),
    "G4: trigger_open, the append-only trigger lets everything through": (
        "refuse_event_change.sql",
        [(r"begin\n    if tg_op", "begin\n    return coalesce(new, old);\n    if tg_op", 1)],
        "G4",
        "test_the_owner_is_refused_too",
    ),
    "G4: truncate_open, the append-only trigger lets TRUNCATE through": (
        "refuse_event_change.sql",
        [
            (
                r"begin\n    if tg_op",
                "begin\n    if tg_op = 'TRUNCATE' then\n        return null;\n    end if;"
                "\n    if tg_op",
                1,
            )
        ],
        "G4",
        "test_the_owner_cannot_truncate_events",
    ),
    "G5: completion_unfenced, completion without the fencing check": (
        "finish_operation.sql",
        [
            (
                r"perform keel.assert_lease\(keel.lock_task\(p_tenant_id, v_task_id, 'share'\),"
                r" p_fencing_token, v_now\);",
                "",
                1,
            )
        ],
        "G5",
        "test_completing_an_operation_with_a_stale_token_is_refused",
    ),
    "G9: keys_unchecked, payload keys are not checked": (
        "check_payload.sql",
        [(r"if v_path is not null then", "if false then", 1)],
        "G9",
        "test_secret_bearing_keys_are_refused_naming_the_path",
    ),
    "G1: agent_table_select, the agent reads tables again": (
        "policies/03_privileges.sql",
        [
            (
                r"revoke all on all tables in schema keel from keel_agent;",
                "grant select on keel.tasks, keel.task_events, keel.operations to keel_agent;",
                1,
            )
        ],
        "G1",
        "test_explain_estimates_reveal_no_value_only_another_tenant_has",
    ),
    "G3: actor_from_caller, the event records what the caller claims": (
        "transition_task.sql",
        [(r"v_actor text := session_user;", "v_actor text := coalesce(p_actor, current_user);", 1)],
        "G3",
        "test_events_name_the_login_and_keep_the_callers_label_apart",
    ),
    "G5: claim_window, a claim that gives up on locked rows": (
        "claim_next_tasks.sql",
        [(r"for update skip locked", "for update nowait", 1)],
        "G5",
        "test_a_tenant_locking_its_due_tasks_does_not_stall_another_tenants_claim",
    ),
    "G5: takeovers_uncounted, a claim of an expired lease does not count as a recovery": (
        "claim_locked_task.sql",
        [(r"\+ \(case when p_task\.lease_owner is not null then 1 else 0 end\)", "+ 0", 1)],
        "G5",
        "test_takeovers_by_claims_count_and_end_in_exhaustion",
    ),
    "G5: wake_at_unclamped, a wake time in the past is stored as given": (
        "check_wake_at.sql",
        [(r"if p_wake_at is null or p_wake_at <= p_now then", "if p_wake_at is null then", 1)],
        "G5",
        "test_a_wake_time_in_the_past_is_stored_as_now",
    ),
    "G5: interval_compared, caps compare intervals instead of timestamps": (
        "interval_end.sql",
        [
            (
                r"if v_end is null or v_end <= p_now or v_end > p_now \+ p_max then",
                "if v_end is null or p_interval <= interval '0' or p_interval > p_max then",
                1,
            )
        ],
        "G5+G1+G2",
        "test_lease_durations_are_checked_as_timestamps",
    ),
    "G9: outbox_unchecked, outbox messages skip the payload check": (
        "transition_task.sql",
        [(r"perform keel.check_payload\('outbox message'[^;]*;", "", 1)],
        "G9",
        "test_every_stored_payload_refuses_secret_bearing_keys",
    ),
    "G9: result_unchecked, operation results and errors skip the payload check": (
        "finish_operation.sql",
        [(r"perform keel.check_payload\('operation (result|error)'[^;]*;", "", 2)],
        "G9",
        "test_every_stored_payload_refuses_secret_bearing_keys",
    ),
    "G3: born_due, a task created in a terminal state is due": (
        "create_task.sql",
        [(r"if v_terminal then\n        v_wake_at := null;", "if false then\n        null;", 1)],
        "G3",
        "test_a_task_created_in_a_terminal_state_is_never_due",
    ),
    "G3: unreachable_states, define_workflow accepts states no task can reach": (
        "define_workflow.sql",
        [(r"where s\.state not in \(select r\.state from reachable as r\)", "where false", 1)],
        "G3",
        "test_define_workflow_refuses_unreachable_and_dead_end_states",
    ),
    "G7: agent_idle_unbounded, keel_agent keeps idle transactions forever": (
        "policies/06_role_settings.sql",
        [
            (
                r"alter role keel_agent set idle_in_transaction_session_timeout = '10s';",
                "alter role keel_agent reset idle_in_transaction_session_timeout;",
                1,
            )
        ],
        "G7",
        "test_an_agent_login_left_idle_in_a_transaction_is_terminated",
    ),
    "G9: depth_unchecked, deep payloads reach the key walk": (
        "check_payload.sql",
        [
            (
                r"if jsonb_path_exists\(p_payload, format",
                "if false and jsonb_path_exists(p_payload, format",
                1,
            )
        ],
        "G9",
        "test_payloads_nested_deeper_than_the_limit_are_refused_before_any_other_work",
    ),
    "G8: reuse_unrecorded, begin_step reuses a result without recording STEP_RESULT_REUSED": (
        "begin_step.sql",
        [(r"insert into keel\.task_events \(.*?\);", "null;", 1)],
        "G8",
        "test_a_killed_worker_is_resumed_without_re_executing_completed_steps",
    ),
    "G6: outbox_dropped, a transition commits without its outbox messages": (
        "transition_task.sql",
        [(r"insert into keel\.outbox \(.*?\);", "null;", 1)],
        # The G3 test of the same-transaction commit reads the rows too.
        "G6+G3",
        "test_racing_workers_keep_every_guarantee",
    ),
    "G6: ack_unfenced, ack_outbox without the token check": (
        "ack_outbox.sql",
        [(r"perform keel\.assert_outbox_claim\(v_message, p_claim_token\);", "", 1)],
        "G6",
        "test_an_expired_claim_is_taken_over_and_the_stale_token_changes_nothing",
    ),
    "G3: session_terminal_overwritten, a running step update replaces a finished one": (
        "record_session_update.sql",
        [(r"elsif v_latest\.status in \('completed', 'failed'\) and ", "elsif false and ", 2)],
        "G3",
        "test_a_finished_step_is_never_replaced_by_a_running_update",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_a_broken_function(migrated_db, mutation):
    file, edits, guarantees, test_name = MUTATIONS[mutation]
    guarantee, *others = guarantees.split("+")
    break_function(migrated_db, file, *edits)
    # -n 2: the suite waits more than it computes (idle-timeout, race and relay tests)
    selection = [] if MUTATIONS_FULL else ["--guarantee", guarantees.replace("+", ",")]
    result = run_agentkeel("conformance", "--dsn", migrated_db, "-q", "-n", "2", *selection)
    assert result.returncode == 1, result.stdout[-3000:]
    table = verdicts(result.stdout)
    assert table[guarantee] == "FAILED"
    assert re.search(rf"^{guarantee} FAILED \S*::{test_name}\b", result.stdout, re.MULTILINE)
    if MUTATIONS_FULL:
        # Only tests that prove this guarantee (some prove several) may fail: each failed
        # test (module::function) with every guarantee it was reported under.
        failed: dict[str, set[str]] = {}
        for gid, test in re.findall(
            r"^(G\d+) FAILED (\S+?::[^\s\[:]+)", result.stdout, flags=re.MULTILINE
        ):
            failed.setdefault(test, set()).add(gid)
        assert failed and all(gids & {guarantee, *others} for gids in failed.values()), failed


def test_the_embedded_default_runs_with_no_dsn():
    result = run_agentkeel("conformance", "-q", "-k", "contiguous or two_claimers or concurrent")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert verdicts(result.stdout)["G5"] == "passed"


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
