"""The planted bugs the suite must catch: one broken variant of one SQL file each.

Each Mutation names the guarantee it breaks and the test that must report it; every
conformance test's docstring ends with the mutation that fails it (`Mutation: <name>`) or
why none applies (tests/test_conformance_docstrings.py). The project's tests install each
one in a database of its own and run the suite (tests/test_conformance_cli.py).

Beside these, `guards()` finds every `raise exception` of the SQL API, and every call of
a guard function (`perform keel.require_tenant(...)`, `assert_lease`, `check_payload`, ...),
and `disabled()` turns one into a no-op: generated mutants, one per guard, which
tests/test_mutants.py runs on demand and reports the survivors of (a guard no test
notices is missing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Edit:
    """re.subn(pattern, replacement, source, flags=re.DOTALL) must make `count` changes."""

    pattern: str
    replacement: str
    count: int


@dataclass(frozen=True)
class Mutation:
    name: str  # what conformance docstrings cite: "Mutation: <name>"
    guarantee: str  # the guarantee it breaks: the suite must say it FAILED
    breaks: str  # what the broken variant does, in words
    file: str  # the repeatable file it replaces: functions/<file>, or a path from the root
    edits: tuple[Edit, ...]
    caught_by: str  # the test that must report it, under `guarantee`
    # Guarantees whose tests may fail too (the same bug breaks them), run alongside.
    also: tuple[str, ...] = field(default=())

    @property
    def path(self) -> str:
        return self.file if "/" in self.file else f"functions/{self.file}"

    def apply(self, source: str) -> str:
        """The broken variant of source; ValueError when an edit does not apply as stated."""
        for edit in self.edits:
            source, count = re.subn(edit.pattern, edit.replacement, source, flags=re.DOTALL)
            if count != edit.count:
                raise ValueError(
                    f"{self.name}: {edit.pattern!r} made {count} changes in {self.file}"
                )
        return source


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="plain_tenant_id",
        guarantee="G1",
        breaks="trusted_session trusts every login's plain tenant id",
        file="trusted_session.sql",
        edits=(Edit(r"pg_catalog.pg_has_role\(session_user, 'keel_app', 'member'\)", r"true", 1),),
        caught_by="test_a_plain_tenant_id_is_ignored_for_the_agent",
        # The agent's token is then ignored too: tests of other guarantees that act as an
        # agent login (the actor test, the fairness attack) fail with it.
        also=("G3", "G5"),
    ),
    Mutation(
        name="adopt_any_tenant",
        guarantee="G1",
        breaks="require_tenant lets a trusted call leave its context",
        file="adopt_tenant.sql",
        edits=(
            Edit(
                r"if v_context is null and keel.trusted_session\(\) then",
                r"if keel.trusted_session() then",
                1,
            ),
        ),
        caught_by="test_the_app_without_context_sees_nothing_and_acts_only_in_the_tenant_it_names",
    ),
    Mutation(
        name="session_context",
        guarantee="G1",
        breaks="current_tenant honours a context left by an earlier transaction",
        file="current_tenant.sql",
        edits=(
            Edit(
                r"pg_catalog.current_setting\('keel.context_stamp', true\)"
                r"\s+is distinct from keel.context_stamp\(\)",
                r"false",
                1,
            ),
        ),
        caught_by="test_a_session_level_app_context_is_ignored_by_later_transactions",
    ),
    Mutation(
        name="agent_plain_context",
        guarantee="G1",
        breaks="an agent's plain tenant id is honoured like a trusted one",
        file="trusted_session.sql",
        edits=(
            Edit(
                r"(pg_catalog.pg_has_role\(session_user, 'keel_app', 'member'\))",
                r"\1 or pg_catalog.pg_has_role(session_user, 'keel_agent', 'member')",
                1,
            ),
        ),
        caught_by="test_a_tenant_id_an_agent_plants_gives_it_nothing",
    ),
    Mutation(
        name="numbers_unchecked",
        guarantee="G9",
        breaks="numbers no double holds are stored",
        file="check_payload.sql",
        edits=(
            Edit(
                r"@\.abs\(\) > 1\.7976931348623157e308 \|\| @\.abs\(\) < 2\.2250738585072014e-308",
                r"@.abs() < 0",
                1,
            ),
        ),
        caught_by="test_numbers_no_double_can_hold_are_refused",
    ),
    Mutation(
        name="token_login_unchecked",
        guarantee="G1",
        breaks="a token bound to a login verifies for any login",
        file="verify_tenant_token.sql",
        edits=(
            Edit(r"and (v_parts\[5\] <> encode\(convert_to\(session_user)", r"and false and \1", 1),
        ),
        caught_by="test_a_token_bound_to_one_agent_login_is_refused_to_another",
    ),
    Mutation(
        name="token_snapshot_isolation",
        guarantee="G1",
        breaks="tokens verify in a snapshot that hides retirements",
        file="verify_tenant_token.sql",
        edits=(
            Edit(r"current_setting\('transaction_isolation'\) <> 'read committed'", r"false", 1),
        ),
        caught_by="test_a_key_retired_inside_an_open_transaction_stops_its_tokens_there",
    ),
    Mutation(
        name="expiry_at_transaction_start",
        guarantee="G1",
        breaks="a token is judged at the transaction's start",
        file="verify_tenant_token.sql",
        edits=(Edit(r"<= clock_timestamp\(\) then  -- at call time", r"<= now() then", 1),),
        caught_by="test_a_token_expiring_inside_an_open_transaction_stops_working_there",
    ),
    Mutation(
        name="recover_ignores_context",
        guarantee="G5",
        breaks="the recoverer takes other tenants' tasks in a context",
        file="recover_stale_tasks.sql",
        edits=(
            Edit(
                r"lock_task_to_recover\(v_now, p_workflow, v_after, v_context\)",
                r"lock_task_to_recover(v_now, p_workflow, v_after)",
                1,
            ),
        ),
        caught_by="test_a_transaction_acting_for_a_tenant_recovers_only_that_tenants_tasks",
    ),
    Mutation(
        name="recover_max_raisable",
        guarantee="G5",
        breaks="a caller raises the maximum of recovery attempts",
        file="recover_stale_tasks.sql",
        edits=(
            Edit(
                r"v_max := least\(coalesce\(v_max, keel\.max_recovery_attempts\(\)\), ",
                r"v_max := coalesce(v_max, keel.max_recovery_attempts()) + 0 * least(0, ",
                1,
            ),
        ),
        caught_by="test_a_recoverer_cannot_raise_the_maximum_of_recovery_attempts",
    ),
    Mutation(
        name="claim_token_sequential",
        guarantee="G6",
        breaks="the next claim token is the previous one plus one",
        file="claim_outbox.sql",
        edits=(
            Edit(
                r"claim_token = keel\.claim_token_of\(v_secret, o\.message_id\),",
                r"claim_token = o.claim_token + 1,",
                1,
            ),
        ),
        caught_by="test_a_live_claim_cannot_be_guessed_by_another_relay",
    ),
    Mutation(
        name="attempts_at_claim",
        guarantee="G6",
        breaks="a claim spends an attempt as it did before migration 0034",
        file="claim_outbox.sql",
        edits=(
            Edit(
                r"claims = o\.claims \+ 1", r"claims = o.claims + 1, attempts = o.attempts + 1", 1
            ),
        ),
        caught_by="test_a_crash_between_publish_and_ack_spends_no_attempt",
    ),
    Mutation(
        name="sweep_blind",
        guarantee="G6",
        breaks="the relay's sweep promotes no held message",
        file="promote_outbox_heads.sql",
        edits=(
            Edit(
                r"if v_stuck\[i\] and keel\.promote_outbox_head",
                r"if false and keel.promote_outbox_head",
                1,
            ),
        ),
        caught_by="test_a_message_written_while_the_one_ahead_of_it_is_acked_is_claimed_after_the_sweep",
    ),
    Mutation(
        name="claim_trusts_held",
        guarantee="G6",
        breaks="the claim takes every message not held, unchecked",
        file="claim_outbox.sql",
        edits=(
            Edit(
                r"\(\n                    o\.message_key is null.*?\) as head", r"true as head", 1
            ),
        ),
        caught_by="test_two_first_messages_of_a_key_written_at_once_are_claimed_one_at_a_time",
    ),
    Mutation(
        name="claim_outbox_unfair",
        guarantee="G6",
        breaks="the claim serves the oldest messages of any tenant first, with no share",
        file="claim_outbox.sql",
        edits=(Edit(r"v_fair := cardinality\(v_due\) >= 1;", "v_fair := false;", 1),),
        caught_by="test_one_tenants_backlog_does_not_stand_in_front_of_another_tenants_message",
    ),
    Mutation(
        name="batch_bytes_unchecked",
        guarantee="G3",
        breaks="a batch of any size in bytes is run",
        file="check_batch.sql",
        edits=(Edit(r"if pg_column_size\(p_items\) > v_bytes then", r"if false then", 1),),
        caught_by="test_a_batch_over_the_byte_budget_is_refused_whole",
    ),
    Mutation(
        name="payload_before_lookup",
        guarantee="G3",
        breaks="payloads are checked before the task is looked up",
        file="transition_task.sql",
        edits=(
            Edit(
                r"(    v_task := keel\.lock_task\(p_tenant_id, p_task_id\);)",
                "    perform keel.check_payload("
                "'event payload', p_payload, 'max_event_payload_bytes');\n\\1",
                1,
            ),
        ),
        caught_by="test_a_missing_task_is_refused_before_its_payload_is_read",
    ),
    Mutation(
        name="transition_messages_unbounded",
        guarantee="G9",
        breaks="a transition writes any number of messages",
        file="check_outbox_messages.sql",
        edits=(
            Edit(r"if jsonb_array_length\(p_outbox\) > v_max_messages then", r"if false then", 1),
        ),
        caught_by="test_a_transition_writes_at_most_the_set_number_of_outbox_messages",
    ),
    Mutation(
        name="hash_unchecked",
        guarantee="G2",
        breaks="reserve without the hash comparison",
        file="check_operation_replay.sql",
        edits=(Edit(r"if v_differs is not null then.*?end if;", r"-- conflict check removed", 1),),
        caught_by="test_a_reused_key_with_different_input_conflicts",
    ),
    Mutation(
        name="retry_unguarded",
        guarantee="G2",
        breaks="a retry of a retryable key is taken whatever the row's state is by then",
        file="reserve_operation.sql",
        edits=(Edit(r"\n            and o\.state = 'retryable'\n", "\n", 1),),
        caught_by="test_concurrent_retries_of_a_retryable_key_start_one_attempt",
    ),
    Mutation(
        name="version_unchecked",
        guarantee="G3",
        breaks="transition without the version check",
        file="transition_task.sql",
        edits=(Edit(r"if v_task.state_version <> p_expected_version then.*?end if;", r"", 1),),
        caught_by="test_a_stale_version_is_refused",
    ),
    Mutation(
        name="trigger_open",
        guarantee="G4",
        breaks="the append-only trigger lets everything through",
        file="refuse_event_change.sql",
        edits=(
            Edit(r"begin\n    if tg_op", "begin\n    return coalesce(new, old);\n    if tg_op", 1),
        ),
        caught_by="test_the_owner_is_refused_too",
    ),
    Mutation(
        name="truncate_open",
        guarantee="G4",
        breaks="the append-only trigger lets TRUNCATE through",
        file="refuse_event_change.sql",
        edits=(
            Edit(
                r"begin\n    if tg_op",
                "begin\n"
                "    if tg_op = 'TRUNCATE' then\n        return null;\n    end if;\n    if tg_op",
                1,
            ),
        ),
        caught_by="test_the_owner_cannot_truncate_events",
    ),
    Mutation(
        name="completion_unfenced",
        guarantee="G5",
        breaks="completion without the fencing check",
        file="finish_operation.sql",
        edits=(
            Edit(
                r"perform keel.assert_lease\(keel.lock_task\(p_tenant_id, v_task_id, 'share'\)"
                r", p_fencing_token, v_now\);",
                r"",
                1,
            ),
        ),
        caught_by="test_completing_an_operation_with_a_stale_token_is_refused",
    ),
    Mutation(
        name="keys_unchecked",
        guarantee="G9",
        breaks="payload keys are not checked",
        file="check_payload.sql",
        edits=(Edit(r"if v_path is not null then", r"if false then", 1),),
        caught_by="test_secret_bearing_keys_are_refused_naming_the_path",
    ),
    Mutation(
        name="agent_table_select",
        guarantee="G1",
        breaks="the agent reads tables again",
        file="policies/03_privileges.sql",
        edits=(
            Edit(
                r"revoke all on all tables in schema keel from keel_agent;",
                r"grant select on keel.tasks, keel.task_events, keel.operations to keel_agent;",
                1,
            ),
        ),
        caught_by="test_explain_estimates_reveal_no_value_only_another_tenant_has",
    ),
    Mutation(
        name="actor_from_caller",
        guarantee="G3",
        breaks="the event records what the caller claims",
        file="append_events.sql",
        edits=(
            Edit(
                r"session_user, (p_claimed_actors\[1\]|e\.claimed_actor),",
                r"coalesce(\1, current_user), \1,",
                2,
            ),
        ),
        caught_by="test_events_name_the_login_and_keep_the_callers_label_apart",
    ),
    Mutation(
        name="claim_window",
        guarantee="G5",
        breaks="a claim that gives up on locked rows",
        file="claim_next_tasks.sql",
        edits=(Edit(r"for update skip locked", r"for update nowait", 1),),
        caught_by="test_a_tenant_locking_its_due_tasks_does_not_stall_another_tenants_claim",
    ),
    Mutation(
        name="takeovers_uncounted",
        guarantee="G5",
        breaks="a claim of an expired lease does not count as a recovery",
        file="claim_locked_tasks.sql",
        edits=(Edit(r"\+ \(case when t\.lease_owner is not null then 1 else 0 end\)", r"+ 0", 1),),
        caught_by="test_takeovers_by_claims_count_and_end_in_exhaustion",
    ),
    Mutation(
        name="wake_at_unclamped",
        guarantee="G5",
        breaks="a wake time in the past is stored as given",
        file="check_wake_at.sql",
        edits=(
            Edit(
                r"if p_wake_at is null or p_wake_at <= p_now then", r"if p_wake_at is null then", 1
            ),
        ),
        caught_by="test_a_wake_time_in_the_past_is_stored_as_now",
    ),
    Mutation(
        name="interval_compared",
        guarantee="G5",
        breaks="caps compare intervals instead of timestamps",
        file="interval_end.sql",
        edits=(
            Edit(
                r"if v_end is null or v_end <= p_now or v_end > p_now \+ p_max then",
                r"if v_end is null or p_interval <= interval '0' or p_interval > p_max then",
                1,
            ),
        ),
        caught_by="test_lease_durations_are_checked_as_timestamps",
        also=("G1", "G2"),
    ),
    Mutation(
        name="outbox_unchecked",
        guarantee="G9",
        breaks="outbox messages skip the payload check",
        file="transition_task.sql",
        edits=(Edit(r"perform keel.check_payload\('outbox message'[^;]*;", r"", 1),),
        caught_by="test_every_stored_payload_refuses_secret_bearing_keys",
    ),
    Mutation(
        name="result_unchecked",
        guarantee="G9",
        breaks="operation results and errors skip the payload check",
        file="finish_operation.sql",
        edits=(Edit(r"perform keel.check_payload\('operation (result|error)'[^;]*;", r"", 2),),
        caught_by="test_every_stored_payload_refuses_secret_bearing_keys",
    ),
    Mutation(
        name="born_due",
        guarantee="G3",
        breaks="a task created in a terminal state is due",
        file="create_task.sql",
        edits=(
            Edit(
                r"if v_terminal then\n        v_wake_at := null;", "if false then\n        null;", 1
            ),
        ),
        caught_by="test_a_task_created_in_a_terminal_state_is_never_due",
    ),
    Mutation(
        name="unreachable_states",
        guarantee="G3",
        breaks="define_workflow accepts states no task can reach",
        file="define_workflow.sql",
        edits=(
            Edit(
                r"where s\.state not in \(select r\.state from reachable as r\)", r"where false", 1
            ),
        ),
        caught_by="test_define_workflow_refuses_unreachable_and_dead_end_states",
    ),
    Mutation(
        name="agent_idle_unbounded",
        guarantee="G7",
        breaks="keel_agent keeps idle transactions forever",
        file="policies/06_role_settings.sql",
        edits=(
            Edit(
                r"alter role keel_agent set idle_in_transaction_session_timeout = '10s';",
                r"alter role keel_agent reset idle_in_transaction_session_timeout;",
                1,
            ),
        ),
        caught_by="test_an_agent_login_left_idle_in_a_transaction_is_terminated",
    ),
    Mutation(
        name="depth_unchecked",
        guarantee="G9",
        breaks="deep payloads reach the key walk",
        file="check_payload.sql",
        edits=(
            Edit(
                r"if jsonb_path_exists\(p_payload, format",
                r"if false and jsonb_path_exists(p_payload, format",
                1,
            ),
        ),
        caught_by="test_payloads_nested_deeper_than_the_limit_are_refused_before_any_other_work",
    ),
    Mutation(
        name="reuse_unrecorded",
        guarantee="G8",
        breaks="begin_step reuses a result without recording STEP_RESULT_REUSED",
        file="begin_step.sql",
        edits=(Edit(r"perform keel\.append_event\(.*?\);", r"null;", 1),),
        caught_by="test_a_killed_worker_is_resumed_without_re_executing_completed_steps",
    ),
    Mutation(
        name="outbox_dropped",
        guarantee="G6",
        breaks="a transition commits without its outbox messages",
        file="write_outbox.sql",
        edits=(Edit(r"insert into keel\.outbox \(.*?\);", r"null;", 1),),
        caught_by="test_racing_workers_keep_every_guarantee",
        # The G3 test of the same-transaction commit reads the rows too.
        also=("G3",),
    ),
    Mutation(
        name="ack_unfenced",
        guarantee="G6",
        breaks="ack_outbox without the token check",
        file="ack_outbox.sql",
        edits=(Edit(r"perform keel\.assert_outbox_claim\(v_message, p_claim_token\);", r"", 1),),
        caught_by="test_an_expired_claim_is_taken_over_and_the_stale_token_changes_nothing",
    ),
    Mutation(
        name="batch_ack_unfenced",
        guarantee="G6",
        breaks="a batch of acks delivers a message whatever its claim token",
        file="ack_tenant_outbox_messages.sql",
        edits=(
            Edit(
                r"\s+and o\.claim_token = p_claim_tokens\["
                r"array_position\(p_message_ids, o\.message_id\)\]",
                "",
                1,
            ),
        ),
        caught_by="test_a_batch_of_acks_acks_each_current_claim_and_refuses_the_rest_alone",
    ),
    Mutation(
        name="pending_count_never_recounted",
        guarantee="G9",
        breaks="the pending-message quota trusts its counter where a count would decide",
        file="count_pending_messages.sql",
        edits=(
            Edit(r"if not v_based or v_held \+ p_delta > p_max then", "if not v_based then", 1),
        ),
        caught_by="test_the_pending_message_quota_counts_again_what_the_owner_removed_by_hand",
    ),
    Mutation(
        name="batch_lease_unchecked",
        guarantee="G3",
        breaks="a batch writes a plain item whatever fencing token it presents",
        file="transition_tasks.sql",
        edits=(Edit(r"\n\s+and l\.fencing_token = i\.token\n", "\n", 1),),
        caught_by="test_a_batch_decides_every_item_as_the_single_calls_would",
    ),
    Mutation(
        name="batch_locks_skipping",
        guarantee="G3",
        breaks="a batch skips the rows other transactions hold, then meets them in item order",
        file="transition_tasks.sql",
        edits=(
            Edit(
                r"\n                for update\n            \) as l;",
                "\n                for update skip locked\n            ) as l;",
                1,
            ),
        ),
        caught_by="test_two_batches_of_the_same_tasks_never_deadlock",
    ),
    Mutation(
        name="batch_wait_fails_whole",
        guarantee="G3",
        breaks="a batch's wait for a held task fails the whole batch on its lock timeout",
        file="transition_tasks.sql",
        edits=(
            Edit(
                r"exception when lock_not_available or deadlock_detected or serialization_failure",
                "exception when division_by_zero",
                1,
            ),
        ),
        caught_by="test_a_task_another_transaction_holds_refuses_only_its_item",
    ),
    Mutation(
        name="session_terminal_overwritten",
        guarantee="G3",
        breaks="a running step update replaces a finished one",
        file="record_session_update.sql",
        edits=(
            Edit(
                r"elsif v_latest\.status in \('completed', 'failed'\) and ", r"elsif false and ", 2
            ),
        ),
        caught_by="test_a_finished_step_is_never_replaced_by_a_running_update",
    ),
    Mutation(
        name="deletion_order_skips_a_table",
        guarantee="G10",
        breaks="tenant deletion leaves keel.sessions to the final cascade, uncounted and unbounded",
        file="tenant_deletion_order.sql",
        edits=(
            Edit(
                r"t\.oid <> 'keel\.tenants'::regclass",
                "t.oid not in ('keel.tenants'::regclass, 'keel.sessions'::regclass)",
                1,
            ),
        ),
        caught_by="test_deleting_a_tenant_removes_every_row_of_it_and_nothing_of_any_other",
    ),
    Mutation(
        name="deleted_tenant_served",
        guarantee="G10",
        breaks="API calls for a tenant being deleted are served",
        file="require_tenant.sql",
        edits=(Edit(r"if v_since is not null then", "if false then", 1),),
        caught_by="test_writers_racing_the_deletion_leave_no_row_behind",
    ),
    Mutation(
        name="keys_destroyed_last",
        guarantee="G10",
        breaks="the first deletion step leaves the data keys, to be removed with the rows",
        file="delete_tenant.sql",
        edits=(
            Edit(r"v_keys := keel\.destroy_tenant_data_keys\(p_tenant_id\);", "v_keys := 0;", 1),
        ),
        caught_by="test_the_first_step_destroys_the_data_keys_and_refuses_the_tenant_everywhere",
    ),
    Mutation(
        name="resumed_with_another_policy",
        guarantee="G10",
        breaks="a deletion resumed with the other events policy is run under it",
        file="delete_tenant.sql",
        edits=(Edit(r"elsif v_deletion\.events <> p_events then", "elsif false then", 1),),
        caught_by="test_an_interrupted_deletion_resumes_and_a_finished_one_stays_finished",
    ),
    Mutation(
        name="deletion_step_unbounded",
        guarantee="G10",
        breaks="a deletion step takes any number of rows",
        file="delete_tenant.sql",
        edits=(
            Edit(
                r"if p_batch is null or p_batch not between 1 and 100000 then",
                "if p_batch is null then",
                1,
            ),
        ),
        caught_by="test_only_the_owner_deletes_and_bad_arguments_are_refused",
    ),
    Mutation(
        name="purge_takes_live_tasks",
        guarantee="G11",
        breaks="the purge takes tasks in any state, not only terminal ones",
        file="purge.sql",
        edits=(
            Edit(
                r"'exists \(select 1 from keel\.workflow_states as s where s\.workflow"
                r" = x\.workflow'\n\s+' and s\.workflow_version = x\.workflow_version"
                r" and s\.state = x\.state and s\.terminal\)'\n\s+' and not exists",
                "'not exists",
                1,
            ),
        ),
        caught_by="test_the_purge_removes_what_retention_says_and_nothing_live",
    ),
    Mutation(
        name="purge_waits_on_locks",
        guarantee="G11",
        breaks="the purge locks its candidates without SKIP LOCKED: it waits on rows others hold",
        file="purge_rows.sql",
        edits=(Edit(r"' for update of x skip locked\) as x',", "' for update of x) as x',", 1),),
        caught_by="test_the_purge_skips_rows_someone_holds_and_takes_them_later",
    ),
    Mutation(
        name="purge_children_of_any_task",
        guarantee="G11",
        breaks="the purge removes the rows of any task of the tenant with the finished ones",
        file="purge_rows.sql",
        edits=(
            Edit(
                r"format\('x\.%I = any\(\$2::%s\[\]\)'", "format('true or x.%I = any($2::%s[])'", 1
            ),
        ),
        caught_by="test_a_purge_racing_with_transitions_claims_and_acks_loses_nothing_live",
    ),
    Mutation(
        name="purge_step_unbounded",
        guarantee="G11",
        breaks="a purge step takes any number of rows",
        file="purge.sql",
        edits=(
            Edit(
                r"if p_batch is null or p_batch not between 1 and 100000 then",
                "if p_batch is null then",
                1,
            ),
        ),
        caught_by="test_only_the_owner_purges_and_bad_arguments_are_refused",
    ),
    Mutation(
        name="checkpoint_bytes_unchecked",
        guarantee="G9",
        breaks="a checkpoint save neither counts nor checks the tenant's checkpoint bytes",
        file="save_checkpoint.sql",
        edits=(
            Edit(
                r"perform keel\.add_tenant_usage\(p_tenant_id, 'checkpoint_bytes', "
                r"octet_length\(p_ciphertext\)\);",
                "null;",
                1,
            ),
        ),
        caught_by="test_a_tenant_holds_checkpoint_bytes_up_to_its_quota_and_a_purge_gives_them_back",
    ),
    Mutation(
        name="purge_credits_nothing",
        guarantee="G9",
        breaks="a purge removes checkpoints but credits none of their bytes to the tenant",
        file="purge_rows.sql",
        edits=(
            Edit(
                r"insert into keel\.tenant_usage_credits \(tenant_id, counter, amount\)"
                r"\s+values \(p_tenant_id, 'checkpoint_bytes', v_bytes\);",
                "null;",
                1,
            ),
        ),
        caught_by="test_a_tenant_holds_checkpoint_bytes_up_to_its_quota_and_a_purge_gives_them_back",
    ),
    Mutation(
        name="purge_waits_on_saves",
        guarantee="G11",
        breaks="a purge takes the bytes it removed off the tenant's counter, under its lock",
        file="purge_rows.sql",
        edits=(
            Edit(
                r"insert into keel\.tenant_usage_credits \(tenant_id, counter, amount\)"
                r"\s+values \(p_tenant_id, 'checkpoint_bytes', v_bytes\);",
                "update keel.tenant_usage as u set amount = u.amount - v_bytes"
                " where u.tenant_id = p_tenant_id and u.counter = 'checkpoint_bytes';",
                1,
            ),
        ),
        caught_by="test_the_purge_does_not_wait_on_a_save_and_gives_its_bytes_back",
    ),
    Mutation(
        name="usage_from_snapshot",
        guarantee="G9",
        breaks="a tenant's checkpoint bytes are counted from what the saving transaction sees",
        file="add_tenant_usage.sql",
        edits=(
            Edit(
                r"update keel\.tenant_usage as u\n    set amount = u\.amount \+ p_amount"
                r".*?\n    end if;\n",
                "select coalesce(sum(octet_length(p.ciphertext)), 0) + p_amount into v_held"
                " from keel.checkpoint_payloads as p where p.tenant_id = p_tenant_id;\n",
                1,
            ),
        ),
        caught_by="test_interleaving",
    ),
    Mutation(
        name="sessions_unbounded",
        guarantee="G9",
        breaks="a tenant creates any number of sessions",
        file="save_session.sql",
        edits=(
            Edit(
                r"perform keel\.check_quota\(p_tenant_id, null, 'max_tenant_sessions', 1\);",
                "null;",
                1,
            ),
        ),
        caught_by="test_a_tenant_holds_sessions_up_to_its_quota_and_then_none",
    ),
)
BY_NAME = {m.name: m for m in MUTATIONS}


# -- generated mutants: each guard of the SQL API disabled in turn -----------------------

RAISE = re.compile(r"\braise\s+exception\b", re.IGNORECASE)
# A call of a function that is all guard (it raises or returns nothing): deleting the call
# disables the guard at that call site alone, which disabling its raise cannot show.
GUARD_CALL = re.compile(r"\bperform\s+keel\.((?:adopt|assert|check|refuse|require)_\w+)\s*\(")
ERRCODE = re.compile(r"errcode\s*=\s*'([0-9A-Z]{5})'", re.IGNORECASE)


@dataclass(frozen=True)
class Guard:
    """One `raise exception ...;` statement of a function file, or one `perform keel.<guard
    function>(...);` call (then `calls` names the function)."""

    path: Path
    start: int  # offsets of the statement in the file's text, the ';' included
    end: int
    line: int
    sqlstate: str | None
    text: str  # the file's text the offsets are in
    calls: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line} {self.calls or self.sqlstate or '?'}"


def _statement_end(text: str, start: int) -> int:
    """The offset just past the ';' that ends the statement starting at start, skipping
    quoted strings ('it''s'), identifiers and -- comments."""
    i, quote = start, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                if i + 1 < len(text) and text[i + 1] == quote:
                    i += 1  # a doubled quote inside the string
                else:
                    quote = None
        elif text.startswith("--", i):
            i = text.find("\n", i)  # a comment: to the end of its line
            if i < 0:
                break
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            return i + 1
        i += 1
    raise ValueError(f"no end of the statement at offset {start}")


def guards(path: Path) -> list[Guard]:
    """Every `raise exception` statement and every call of a guard function in a function
    file, in the order they appear."""
    text = path.read_text(encoding="utf-8")
    found = []
    for pattern in (RAISE, GUARD_CALL):
        for match in pattern.finditer(text):
            line_start = text.rfind("\n", 0, match.start()) + 1
            if "--" in text[line_start : match.start()]:
                continue  # in a comment (or after one on its line)
            end = _statement_end(text, match.start())
            code = ERRCODE.search(text, match.start(), end) if pattern is RAISE else None
            line = text.count("\n", 0, match.start()) + 1
            calls = match[1] if pattern is GUARD_CALL else None
            found.append(
                Guard(path, match.start(), end, line, code[1] if code else None, text, calls)
            )
    return sorted(found, key=lambda g: g.start)


def disabled(guard: Guard) -> str:
    """The file's text, as guards() read it, with that one guard replaced by a no-op."""
    return guard.text[: guard.start] + "null;" + guard.text[guard.end :]
