-- Append-only history (G3, G4): the one place an event is written to keel.task_events.
-- The caller has just written the task row, in the same transaction: the event takes the
-- row's last_event_seq as its seq and records the state, state_version and trace it left
-- the task in. The actor is the login (session_user), whatever role runs the function;
-- what the caller says it is goes to claimed_actor.
create or replace function keel.append_event(
    p_task keel.tasks,
    p_event_type text,
    p_from_state text,
    p_at timestamptz,
    p_fencing_token bigint default null,
    p_payload jsonb default '{}',
    p_claimed_actor text default null,
    p_policy_version text default null
)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into keel.task_events (
        tenant_id, task_id, seq, event_type, from_state, to_state, state_version, actor,
        claimed_actor, policy_version, fencing_token, payload, trace_id, span_id, created_at
    )
    values (
        p_task.tenant_id, p_task.task_id, p_task.last_event_seq, p_event_type, p_from_state,
        p_task.state, p_task.state_version, session_user, p_claimed_actor, p_policy_version,
        p_fencing_token, coalesce(p_payload, '{}'), p_task.trace_id, p_task.span_id, p_at
    );
end;
$$;

comment on function keel.append_event(keel.tasks, text, text, timestamptz, bigint, jsonb, text, text) is
'Writes the event of a change the caller has just made to task row p_task, in the caller''s transaction: seq = p_task.last_event_seq, to_state and state_version as p_task has them, actor = the login (session_user), claimed_actor = what the caller claims. The one writer of keel.task_events, shared by keel.create_task, keel.transition_task, keel.begin_step and keel.recover_locked_task; not granted to any role.';
