-- Append-only history (G3, G4), on Citus: the events of one tenant, one single-row INSERT
-- each. Installed by `agentkeel distribute` in place of functions/append_events.sql,
-- whose INSERT ... SELECT into a distributed table Citus ships with COPY, which
-- row-level security refuses. Same arguments, same rows.
create or replace function keel.append_events(
    p_tenant_id uuid,
    p_task_ids uuid[],
    p_seqs bigint[],
    p_event_types text[],
    p_from_states text[],
    p_to_states text[],
    p_state_versions bigint[],
    p_fencing_tokens bigint[],
    p_payloads jsonb[],
    p_claimed_actors text[],
    p_policy_versions text[],
    p_trace_ids text[],
    p_span_ids text[],
    p_at timestamptz
)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_event record;
begin
    -- Each event's values in a record first: no array element in the INSERT, which Citus
    -- ships to the shard (its worker crashed on one in an UPDATE's SET).
    for v_event in
        select
            e.task_id, e.seq, e.event_type, e.from_state, e.to_state, e.state_version,
            e.fencing_token, coalesce(e.payload, '{}') as payload, e.claimed_actor,
            e.policy_version, e.trace_id, e.span_id
        from unnest(
            p_task_ids, p_seqs, p_event_types, p_from_states, p_to_states, p_state_versions,
            p_fencing_tokens, p_payloads, p_claimed_actors, p_policy_versions, p_trace_ids,
            p_span_ids
        ) as e (
            task_id, seq, event_type, from_state, to_state, state_version, fencing_token,
            payload, claimed_actor, policy_version, trace_id, span_id
        )
    loop
        insert into keel.task_events (
            tenant_id, task_id, seq, event_type, from_state, to_state, state_version, actor,
            claimed_actor, policy_version, fencing_token, payload, trace_id, span_id, created_at
        )
        values (
            p_tenant_id, v_event.task_id, v_event.seq, v_event.event_type, v_event.from_state,
            v_event.to_state, v_event.state_version, session_user, v_event.claimed_actor,
            v_event.policy_version, v_event.fencing_token, v_event.payload, v_event.trace_id,
            v_event.span_id, p_at
        );
    end loop;
end;
$$;

comment on function keel.append_events(uuid, uuid[], bigint[], text[], text[], text[], bigint[], bigint[], jsonb[], text[], text[], text[], text[], timestamptz) is
'Citus variant (installed by agentkeel distribute): writes events of tenant p_tenant_id, event i from item i of each array (task, seq, event type, from and to state, state_version, fencing token, payload, claimed actor, policy version, trace and span id), all at p_at, one single-row INSERT each, in the caller''s transaction; actor = the login (session_user). The one writer of keel.task_events, shared by keel.append_event (one event) and keel.transition_tasks (the events of a batch); not granted to any role.';
