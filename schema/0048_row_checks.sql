-- agentkeel:allow squawk.ban-drop-constraint (each rule moves into the one check added before it: every row still passes, every new row is checked the same)
-- The per-row checks of keel.tasks and keel.task_events (G3, G4), each table's in one
-- function that its one check constraint calls. PostgreSQL reads every check constraint's
-- stored expression and prepares it again for each statement that writes the table: the
-- 12 checks of a task and the 8 of an event were 22% of the instructions of a claim and
-- its completion (tools/dev/instructions.sh). A PL/pgSQL function keeps its prepared
-- expressions for the session, and its constraint is one function call to prepare.
--
-- The rules are the ones the constraints held, and so is the refusal: check_violation
-- (23514) with the old constraint's name in the error's constraint field and in its
-- message, and the table and column named. A NULL passes, as in a check constraint.
--
-- No SET search_path: granted to no role, they run in the pinned search_path of the
-- SECURITY DEFINER functions that write these tables (or in a keel_owner's own session).

create function keel.refuse_row(p_table text, p_constraint text, p_column text)
returns boolean
language plpgsql
immutable
as $$
begin
    raise exception using
        errcode = '23514',
        message = format(
            'new row for relation "%s" violates check constraint "%s"', p_table, p_constraint
        ),
        schema = 'keel',
        table = p_table,
        column = p_column,
        constraint = p_constraint;
end;
$$;

comment on function keel.refuse_row(text, text, text) is
'Raises check_violation (23514) for a row of keel.<p_table> that breaks the rule p_constraint names, on column p_column (keel.check_task_row, keel.check_task_event_row). Never returns.';

create function keel.check_task_row(
    p_state text,
    p_state_version bigint,
    p_last_event_seq bigint,
    p_current_step text,
    p_fencing_token bigint,
    p_lease_owner text,
    p_lease_acquired_at timestamptz,
    p_lease_expires_at timestamptz,
    p_trace_id text,
    p_span_id text,
    p_metadata jsonb,
    p_recovery_attempts integer
)
returns boolean
language plpgsql
immutable
as $$
begin
    -- The common case, every rule kept, in one expression.
    if (p_state ~ '^[a-z][a-z0-9_]{0,62}$') is not false
        and (p_state_version > 0) is not false
        and (p_last_event_seq >= 0) is not false
        and (char_length(p_current_step) between 1 and 200) is not false
        and (p_fencing_token >= 0) is not false
        and (char_length(p_lease_owner) between 1 and 200) is not false
        and (
            (p_lease_owner is null) = (p_lease_expires_at is null)
            and (p_lease_owner is null) = (p_lease_acquired_at is null)
        )
        and (p_trace_id ~ '^[0-9a-f]{32}$' and p_trace_id <> '00000000000000000000000000000000')
        is not false
        and (p_span_id ~ '^[0-9a-f]{16}$' and p_span_id <> '0000000000000000') is not false
        and (jsonb_typeof(p_metadata) = 'object') is not false
        and (p_recovery_attempts >= 0) is not false
    then
        return true;
    end if;
    if not p_state ~ '^[a-z][a-z0-9_]{0,62}$' then
        return keel.refuse_row('tasks', 'tasks_state_check', 'state');
    end if;
    if not p_state_version > 0 then
        return keel.refuse_row('tasks', 'tasks_state_version_check', 'state_version');
    end if;
    if not p_last_event_seq >= 0 then
        return keel.refuse_row('tasks', 'tasks_last_event_seq_check', 'last_event_seq');
    end if;
    if not char_length(p_current_step) between 1 and 200 then
        return keel.refuse_row('tasks', 'tasks_current_step_check', 'current_step');
    end if;
    if not p_fencing_token >= 0 then
        return keel.refuse_row('tasks', 'tasks_fencing_token_check', 'fencing_token');
    end if;
    if not char_length(p_lease_owner) between 1 and 200 then
        return keel.refuse_row('tasks', 'tasks_lease_owner_check', 'lease_owner');
    end if;
    if (p_lease_owner is null) <> (p_lease_expires_at is null)
        or (p_lease_owner is null) <> (p_lease_acquired_at is null) then
        return keel.refuse_row('tasks', 'tasks_lease_complete_check', 'lease_owner');
    end if;
    if not (p_trace_id ~ '^[0-9a-f]{32}$' and p_trace_id <> '00000000000000000000000000000000') then
        return keel.refuse_row('tasks', 'tasks_trace_id_check', 'trace_id');
    end if;
    if not (p_span_id ~ '^[0-9a-f]{16}$' and p_span_id <> '0000000000000000') then
        return keel.refuse_row('tasks', 'tasks_span_id_check', 'span_id');
    end if;
    if not jsonb_typeof(p_metadata) = 'object' then
        return keel.refuse_row('tasks', 'tasks_metadata_check', 'metadata');
    end if;
    return keel.refuse_row('tasks', 'tasks_recovery_attempts_check', 'recovery_attempts');
end;
$$;

comment on function keel.check_task_row(
    text, bigint, bigint, text, bigint, text, timestamptz, timestamptz, text, text, jsonb, integer
) is
'The check of a keel.tasks row (constraint tasks_row_check): state a lower-case identifier of 1 to 63 characters, state_version > 0, last_event_seq >= 0, fencing_token >= 0, recovery_attempts >= 0, current_step and lease_owner 1 to 200 characters, lease owner, acquired and expiry times all set or all null, trace_id 32 and span_id 16 lower-case hex digits not all zero, metadata an object. Returns true, or raises check_violation (23514) naming the rule broken (tasks_state_check ...).';

create function keel.check_task_event_row(
    p_seq bigint,
    p_event_type text,
    p_actor text,
    p_claimed_actor text,
    p_policy_version text,
    p_payload jsonb,
    p_trace_id text,
    p_span_id text
)
returns boolean
language plpgsql
immutable
as $$
begin
    if (p_seq > 0) is not false
        and (p_event_type ~ '^[A-Za-z][A-Za-z0-9_.:-]{0,62}$') is not false
        and (char_length(p_actor) between 1 and 200) is not false
        and (char_length(p_claimed_actor) between 1 and 200) is not false
        and (char_length(p_policy_version) <= 100) is not false
        and (jsonb_typeof(p_payload) = 'object') is not false
        and (p_trace_id ~ '^[0-9a-f]{32}$') is not false
        and (p_span_id ~ '^[0-9a-f]{16}$') is not false
    then
        return true;
    end if;
    if not p_seq > 0 then
        return keel.refuse_row('task_events', 'task_events_seq_check', 'seq');
    end if;
    if not p_event_type ~ '^[A-Za-z][A-Za-z0-9_.:-]{0,62}$' then
        return keel.refuse_row('task_events', 'task_events_event_type_check', 'event_type');
    end if;
    if not char_length(p_actor) between 1 and 200 then
        return keel.refuse_row('task_events', 'task_events_actor_check', 'actor');
    end if;
    if not char_length(p_claimed_actor) between 1 and 200 then
        return keel.refuse_row('task_events', 'task_events_claimed_actor_check', 'claimed_actor');
    end if;
    if not char_length(p_policy_version) <= 100 then
        return keel.refuse_row('task_events', 'task_events_policy_version_check', 'policy_version');
    end if;
    if not jsonb_typeof(p_payload) = 'object' then
        return keel.refuse_row('task_events', 'task_events_payload_check', 'payload');
    end if;
    if not p_trace_id ~ '^[0-9a-f]{32}$' then
        return keel.refuse_row('task_events', 'task_events_trace_id_check', 'trace_id');
    end if;
    return keel.refuse_row('task_events', 'task_events_span_id_check', 'span_id');
end;
$$;

comment on function keel.check_task_event_row(bigint, text, text, text, text, jsonb, text, text) is
'The check of a keel.task_events row (constraint task_events_row_check): seq > 0, event_type an identifier of 1 to 63 characters (letters, digits, _ . : -, a letter first), actor and claimed_actor 1 to 200 characters, policy_version at most 100, payload an object, trace_id 32 and span_id 16 lower-case hex digits. Returns true, or raises check_violation (23514) naming the rule broken (task_events_seq_check ...).';

-- Not validated: the constraints dropped below held the same rules for every existing row,
-- and new rows are checked. Adding them NOT VALID holds each table's lock for a moment,
-- without a scan.
alter table keel.tasks
add constraint tasks_row_check check (
    keel.check_task_row(
        state, state_version, last_event_seq, current_step, fencing_token, lease_owner,
        lease_acquired_at, lease_expires_at, trace_id, span_id, metadata, recovery_attempts
    )
) not valid;

alter table keel.tasks
drop constraint tasks_state_check,
drop constraint tasks_state_version_check,
drop constraint tasks_last_event_seq_check,
drop constraint tasks_current_step_check,
drop constraint tasks_fencing_token_check,
drop constraint tasks_lease_owner_check,
drop constraint tasks_lease_complete_check,
drop constraint tasks_trace_id_check,
drop constraint tasks_span_id_check,
drop constraint tasks_metadata_check,
drop constraint tasks_recovery_attempts_check;

alter table keel.task_events
add constraint task_events_row_check check (
    keel.check_task_event_row(
        seq, event_type, actor, claimed_actor, policy_version, payload, trace_id, span_id
    )
) not valid;

alter table keel.task_events
drop constraint task_events_seq_check,
drop constraint task_events_event_type_check,
drop constraint task_events_actor_check,
drop constraint task_events_claimed_actor_check,
drop constraint task_events_policy_version_check,
drop constraint task_events_payload_check,
drop constraint task_events_trace_id_check,
drop constraint task_events_span_id_check;
