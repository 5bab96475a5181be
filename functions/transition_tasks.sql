-- Guarded transitions (G3), a batch in one round trip: each item is one keel.transition_task
-- call with its own guarantees, run in a subtransaction of its own, so one item's refusal
-- (stale_state, illegal_transition, lease_lost, ...) writes nothing for that item and
-- leaves the others as they were. One tenant per call (CITUS.md rule 24).
-- agentkeel:requires functions/transition_task.sql
-- agentkeel:requires functions/check_batch.sql
create or replace function keel.transition_tasks(
    p_tenant_id uuid,
    p_items jsonb
)
returns table (
    item integer,
    task_id uuid,
    refused_sqlstate text,
    refused_message text,
    state text,
    state_version bigint,
    fencing_token bigint
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_index integer := 0;
    v_task keel.tasks;
    v_sqlstate text;
    v_message text;
begin
    perform keel.require_tenant(p_tenant_id);
    perform keel.check_batch(p_items, array['task_id', 'expected_version', 'to_state']);
    begin
        perform (i.value ->> 'task_id')::uuid from jsonb_array_elements(p_items) as i (value);
    exception when invalid_text_representation then
        raise exception using
            errcode = '22K01',
            message = 'every batch item''s task_id must be a uuid',
            detail = 'Nothing of the batch was run.';
    end;
    for v_item in select i.value from jsonb_array_elements(p_items) as i (value) loop
        v_index := v_index + 1;
        begin
            v_task := keel.transition_task(
                p_tenant_id,
                (v_item ->> 'task_id')::uuid,
                (v_item ->> 'expected_version')::bigint,
                v_item ->> 'to_state',
                p_fencing_token => (v_item ->> 'fencing_token')::bigint,
                p_event_type => coalesce(v_item ->> 'event_type', 'transition'),
                p_payload => coalesce(v_item -> 'payload', '{}'::jsonb),
                p_outbox => coalesce(v_item -> 'outbox', '[]'::jsonb),
                p_actor => v_item ->> 'actor',
                p_policy_version => v_item ->> 'policy_version',
                p_current_step => v_item ->> 'current_step',
                p_release_lease => coalesce((v_item ->> 'release_lease')::boolean, false),
                p_wake_at => (v_item ->> 'wake_at')::timestamptz
            );
            item := v_index;
            task_id := v_task.task_id;
            refused_sqlstate := null;
            refused_message := null;
            state := v_task.state;
            state_version := v_task.state_version;
            fencing_token := v_task.fencing_token;
        exception when others then
            get stacked diagnostics v_sqlstate = returned_sqlstate, v_message = message_text;
            item := v_index;
            task_id := (v_item ->> 'task_id')::uuid;
            refused_sqlstate := v_sqlstate;
            refused_message := v_message;
            state := null;
            state_version := null;
            fencing_token := null;
        end;
        return next;
    end loop;
end;
$$;

comment on function keel.transition_tasks(uuid, jsonb) is
'A batch of keel.transition_task calls for one tenant in one round trip (G3). p_items is a jsonb array (at most settings.max_batch_items) of objects with task_id, expected_version, to_state and optionally fencing_token, event_type, payload, outbox, actor, policy_version, current_step, release_lease, wake_at. Each item runs in its own subtransaction with every guarantee of the single call; the result has one row per item, in order: refused_sqlstate and refused_message null and the new state, state_version and fencing_token on success, else (refused_sqlstate, refused_message) the SQLSTATE and message the single call would have raised, with nothing written for that item. A malformed batch raises invalid_argument (22K01) and writes nothing.';
