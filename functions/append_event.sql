-- Append-only history (G3, G4): one event written to keel.task_events, through
-- keel.append_events.
-- agentkeel:requires functions/append_events.sql
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
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    perform keel.append_events(
        p_task.tenant_id, array[p_task.task_id], array[p_task.last_event_seq],
        array[p_event_type], array[p_from_state], array[p_task.state],
        array[p_task.state_version], array[p_fencing_token], array[p_payload],
        array[p_claimed_actor], array[p_policy_version], array[p_task.trace_id],
        array[p_task.span_id], p_at
    );
end;
$$;

comment on function keel.append_event(keel.tasks, text, text, timestamptz, bigint, jsonb, text, text) is
'Writes the event of a change the caller has just made to task row p_task, in the caller''s transaction: seq = p_task.last_event_seq, to_state and state_version as p_task has them, actor = the login (session_user), claimed_actor = what the caller claims. Written by keel.append_events, the one writer of keel.task_events; shared by keel.create_task, keel.transition_task, keel.begin_step and keel.recover_locked_task; not granted to any role.';
