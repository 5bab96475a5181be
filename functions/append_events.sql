-- Append-only history (G3, G4): the one place events are written to keel.task_events, any
-- number of one tenant's at once, in one statement (keel.append_event writes one through
-- it). Each is the event of a change the caller has just made to a task row, in the same
-- transaction: it takes the row's last_event_seq as its seq and records the state,
-- state_version and trace it left the task in (p_seqs[i], p_to_states[i], ...: item i of
-- every array is event i). The actor is the login (session_user), whatever role runs the
-- function; what the caller says it is goes to claimed_actor. On Citus, agentkeel
-- distribute replaces this with single-row inserts (tools/agentkeel/citus/append_events.sql):
-- an INSERT ... SELECT into a distributed table is shipped there with COPY, which
-- row-level security refuses.
-- agentkeel:allow citus.insert_select (agentkeel distribute installs single-row inserts in its place: tools/agentkeel/citus/append_events.sql)
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
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    if cardinality(p_task_ids) = 1 then
        -- One event (keel.append_event): its values as they are, no unnest to plan.
        insert into keel.task_events (
            tenant_id, task_id, seq, event_type, from_state, to_state, state_version, actor,
            claimed_actor, policy_version, fencing_token, payload, trace_id, span_id, created_at
        )
        values (
            p_tenant_id, p_task_ids[1], p_seqs[1], p_event_types[1], p_from_states[1],
            p_to_states[1], p_state_versions[1], session_user, p_claimed_actors[1],
            p_policy_versions[1], p_fencing_tokens[1], coalesce(p_payloads[1], '{}'),
            p_trace_ids[1], p_span_ids[1], p_at
        );
        return;
    end if;
    insert into keel.task_events (
        tenant_id, task_id, seq, event_type, from_state, to_state, state_version, actor,
        claimed_actor, policy_version, fencing_token, payload, trace_id, span_id, created_at
    )
    select
        p_tenant_id, e.task_id, e.seq, e.event_type, e.from_state, e.to_state,
        e.state_version, session_user, e.claimed_actor, e.policy_version, e.fencing_token,
        coalesce(e.payload, '{}'), e.trace_id, e.span_id, p_at
    from unnest(
        p_task_ids, p_seqs, p_event_types, p_from_states, p_to_states, p_state_versions,
        p_fencing_tokens, p_payloads, p_claimed_actors, p_policy_versions, p_trace_ids,
        p_span_ids
    ) as e (
        task_id, seq, event_type, from_state, to_state, state_version, fencing_token,
        payload, claimed_actor, policy_version, trace_id, span_id
    );
end;
$$;

comment on function keel.append_events(uuid, uuid[], bigint[], text[], text[], text[], bigint[], bigint[], jsonb[], text[], text[], text[], text[], timestamptz) is
'Writes events of tenant p_tenant_id in one statement, event i from item i of each array (task, seq, event type, from and to state, state_version, fencing token, payload, claimed actor, policy version, trace and span id), all at p_at, in the caller''s transaction; actor = the login (session_user). The one writer of keel.task_events, shared by keel.append_event (one event) and keel.transition_tasks (the events of a batch); not granted to any role.';
