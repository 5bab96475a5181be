-- Guarded transitions (G3), a batch in one round trip, with every guarantee of the single
-- call (keel.transition_task) per item: one item's refusal (stale_state,
-- illegal_transition, lease_lost, ...) writes nothing for that item and leaves the others
-- as they were. One tenant per call (CITUS.md rule 24).
-- Two paths. The items a worker sends to finish what it claimed (a task id, a version, a
-- state, a fencing token; no payload, no outbox message, no wake time; each task once in
-- the batch) that pass every check of the single call, checked for all of them at once
-- under their row locks, are written together: one UPDATE of their tasks, then their
-- events. Every other item (a refusal among them) is the single call in a subtransaction
-- of its own, in item order, which raises what it raises alone. A set write that fails
-- (a constraint the checks do not foresee) is undone and its items go the single way.
-- agentkeel:requires functions/transition_task.sql
-- agentkeel:requires functions/check_batch.sql
-- agentkeel:requires functions/append_events.sql
-- agentkeel:requires functions/edge_terminal.sql
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
-- Primary-key lookups: a plan made while keel.tasks was nearly empty (a sequential scan)
-- must not stay in use as the table grows.
set enable_seqscan = off
-- That setting prices a sequential scan at 10^10, which would put a statement that needs
-- one over jit_above_cost: compiling it (tens of ms) would cost more than the batch.
set jit = off
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_count integer;
    v_item jsonb;
    v_task keel.tasks;
    v_sqlstate text;
    v_message text;
    -- Per item, from 1: whether it may take the set path, and its fields.
    v_plain boolean[];
    v_ids uuid[];
    v_versions bigint[];
    v_to_states text[];
    v_tokens bigint[];
    v_event_types text[];
    v_actors text[];
    v_policies text[];
    v_steps text[];
    v_releases boolean[];
    -- The items the set path writes: their item numbers, task ids, and what the UPDATE
    -- needs per task (looked up by the task's place in v_set_ids).
    v_set_items integer[];
    v_set_ids uuid[];
    v_plain_ids uuid[];
    v_set_states text[];
    v_set_from text[];
    v_set_terminal boolean[];
    v_set_keep boolean[];
    v_set_steps text[];
    -- Per item: written by the set path, and what it left the task at.
    v_done boolean[];
    v_states text[];
    v_new_versions bigint[];
    v_new_tokens bigint[];
    v_at integer;
    v_terminal boolean;
    -- A group of the set path's tasks that go the same way, and its values.
    v_group record;
    v_g_state text;
    v_g_terminal boolean;
    v_g_keep boolean;
    v_g_step text;
    v_g_ids uuid[];
    -- The events of the set path, event i from item i of each (keel.append_events).
    v_event integer := 0;
    v_e_tasks uuid[];
    v_e_seqs bigint[];
    v_e_types text[];
    v_e_from text[];
    v_e_to text[];
    v_e_versions bigint[];
    v_e_tokens bigint[];
    v_e_payloads jsonb[];
    v_e_actors text[];
    v_e_policies text[];
    v_e_traces text[];
    v_e_spans text[];
begin
    perform keel.require_tenant(p_tenant_id);
    v_count := keel.check_batch(p_items, array['task_id', 'expected_version', 'to_state']);
    begin
        perform (i.value ->> 'task_id')::uuid from jsonb_array_elements(p_items) as i (value);
    exception when invalid_text_representation then
        raise exception using
            errcode = '22K01',
            message = 'every batch item''s task_id must be a uuid',
            detail = 'Nothing of the batch was run.';
    end;

    -- The plain items: fields of the expected JSON types (anything else the single call
    -- parses, or refuses, itself), an empty payload, no outbox message, no wake time, and
    -- a task named by no other item (the single calls then run in item order).
    select
        array_agg(
            i.value ->> 'task_id' is not null
            and jsonb_typeof(i.value -> 'expected_version') = 'number'
            and (i.value ->> 'expected_version') ~ '^-?[0-9]{1,18}$'
            and jsonb_typeof(i.value -> 'to_state') = 'string'
            and (
                coalesce(jsonb_typeof(i.value -> 'fencing_token'), 'null') = 'null'
                or (
                    jsonb_typeof(i.value -> 'fencing_token') = 'number'
                    and (i.value ->> 'fencing_token') ~ '^-?[0-9]{1,18}$'
                )
            )
            and coalesce(jsonb_typeof(i.value -> 'event_type'), 'null') in ('null', 'string')
            and coalesce(jsonb_typeof(i.value -> 'actor'), 'null') in ('null', 'string')
            and coalesce(jsonb_typeof(i.value -> 'policy_version'), 'null') in ('null', 'string')
            and coalesce(jsonb_typeof(i.value -> 'current_step'), 'null') in ('null', 'string')
            and coalesce(jsonb_typeof(i.value -> 'release_lease'), 'null') in ('null', 'boolean')
            and coalesce(i.value -> 'payload', '{}'::jsonb) = '{}'::jsonb
            and coalesce(i.value -> 'outbox', '[]'::jsonb) = '[]'::jsonb
            and coalesce(jsonb_typeof(i.value -> 'wake_at'), 'null') = 'null'
            and i.named = 1
            order by i.n
        ),
        array_agg((i.value ->> 'task_id')::uuid order by i.n)
    into v_plain, v_ids
    from (
        select e.value, e.n, count(*) over (partition by (e.value ->> 'task_id')::uuid) as named
        from jsonb_array_elements(p_items) with ordinality as e (value, n)
    ) as i;
    select
        array_agg(case when v_plain[i.n] then (i.value ->> 'expected_version')::bigint end order by i.n),
        array_agg(case when v_plain[i.n] then i.value ->> 'to_state' end order by i.n),
        array_agg(case when v_plain[i.n] then (i.value ->> 'fencing_token')::bigint end order by i.n),
        array_agg(
            case when v_plain[i.n] then coalesce(i.value ->> 'event_type', 'transition') end
            order by i.n
        ),
        array_agg(case when v_plain[i.n] then i.value ->> 'actor' end order by i.n),
        array_agg(case when v_plain[i.n] then i.value ->> 'policy_version' end order by i.n),
        array_agg(case when v_plain[i.n] then i.value ->> 'current_step' end order by i.n),
        array_agg(
            case when v_plain[i.n] then coalesce((i.value ->> 'release_lease')::boolean, false) end
            order by i.n
        )
    into v_versions, v_to_states, v_tokens, v_event_types, v_actors, v_policies, v_steps, v_releases
    from jsonb_array_elements(p_items) with ordinality as i (value, n);

    v_done := array_fill(false, array[v_count]);
    if v_count > 0 and true = any(v_plain) then
        v_plain_ids := array(
            select v_ids[n] from generate_subscripts(v_ids, 1) as n where v_plain[n]
        );
        v_set_items := '{}';
        v_set_ids := '{}';
        v_set_from := '{}';
        v_set_terminal := '{}';
        v_set_keep := '{}';
        -- Their tasks locked in one statement, skipping those another transaction holds
        -- (their items go the single way below, which waits for each, or times out, as the
        -- single call does, item by item), and the checks of keel.transition_task on each
        -- locked row, as of now: the lease (keel.assert_lease), the version, the edge
        -- (keel.edge_terminal). An item that fails one goes the single way too, which
        -- refuses it for that reason.
        v_now := clock_timestamp();
        for v_task in
            select t.*
            from keel.tasks as t
            where t.tenant_id = p_tenant_id and t.task_id = any(v_plain_ids)
            order by t.task_id
            for update skip locked
        loop
            -- The item's place: plain items name a task no other item names.
            v_at := array_position(v_ids, v_task.task_id);
            continue when v_task.state_version <> v_versions[v_at];
            if v_tokens[v_at] is null then
                continue when v_task.lease_expires_at > v_now;
            else
                continue when v_task.lease_owner is null
                    or v_task.fencing_token <> v_tokens[v_at]
                    or not coalesce(v_task.lease_expires_at > v_now, false);
            end if;
            v_terminal := keel.edge_terminal(
                v_task.workflow, v_task.workflow_version, v_task.state, v_to_states[v_at]
            );
            continue when v_terminal is null;
            v_set_items := v_set_items || v_at;
            v_set_ids := v_set_ids || v_task.task_id;
            v_set_from := v_set_from || v_task.state;
            v_set_terminal := v_set_terminal || v_terminal;
            v_set_keep := v_set_keep
                || (v_tokens[v_at] is not null and not v_terminal and not v_releases[v_at]);
        end loop;
    end if;

    if cardinality(v_set_ids) > 0 then
        begin
            v_set_states := array(select v_to_states[n] from unnest(v_set_items) as n);
            v_set_steps := array(select v_steps[n] from unnest(v_set_items) as n);
            -- One UPDATE for each group of tasks that go the same way (the common batch,
            -- a worker finishing what it claimed, is one group), with the group's values in
            -- plain variables: Citus routes an UPDATE whose SET holds only columns,
            -- variables and immutable functions (and its worker crashes on an array element
            -- there, v_array[i]). Then the event of each row written.
            for v_group in
                select
                    c.to_state, c.terminal, c.keep, c.step, array_agg(c.task_id) as task_ids
                from unnest(v_set_ids, v_set_states, v_set_terminal, v_set_keep, v_set_steps)
                    as c (task_id, to_state, terminal, keep, step)
                group by c.to_state, c.terminal, c.keep, c.step
            loop
                v_g_state := v_group.to_state;
                v_g_terminal := v_group.terminal;
                v_g_keep := v_group.keep;
                v_g_step := v_group.step;
                v_g_ids := v_group.task_ids;
                for v_task in
                    update keel.tasks as t
                    set
                        state = v_g_state,
                        state_version = t.state_version + 1,
                        last_event_seq = t.last_event_seq + 1,
                        current_step = coalesce(v_g_step, t.current_step),
                        wake_at = case
                            when v_g_terminal then null
                            when v_g_keep then t.lease_expires_at
                            else v_now
                        end,
                        lease_owner = case when v_g_keep then t.lease_owner end,
                        lease_acquired_at = case when v_g_keep then t.lease_acquired_at end,
                        lease_expires_at = case when v_g_keep then t.lease_expires_at end,
                        updated_at = v_now
                    where t.tenant_id = p_tenant_id and t.task_id = any(v_g_ids)
                    returning t.*
                loop
                    v_at := v_set_items[array_position(v_set_ids, v_task.task_id)];
                    v_event := v_event + 1;
                    v_e_tasks[v_event] := v_task.task_id;
                    v_e_seqs[v_event] := v_task.last_event_seq;
                    v_e_types[v_event] := v_event_types[v_at];
                    v_e_from[v_event] := v_set_from[array_position(v_set_ids, v_task.task_id)];
                    v_e_to[v_event] := v_task.state;
                    v_e_versions[v_event] := v_task.state_version;
                    v_e_tokens[v_event] := v_tokens[v_at];
                    v_e_payloads[v_event] := '{}'::jsonb;
                    v_e_actors[v_event] := v_actors[v_at];
                    v_e_policies[v_event] := v_policies[v_at];
                    v_e_traces[v_event] := v_task.trace_id;
                    v_e_spans[v_event] := v_task.span_id;
                    v_states[v_at] := v_task.state;
                    v_new_versions[v_at] := v_task.state_version;
                    v_new_tokens[v_at] := v_task.fencing_token;
                    v_done[v_at] := true;
                end loop;
            end loop;
            -- Their events, in one statement (keel.append_events, the one writer).
            perform keel.append_events(
                p_tenant_id, v_e_tasks, v_e_seqs, v_e_types, v_e_from, v_e_to, v_e_versions,
                v_e_tokens, v_e_payloads, v_e_actors, v_e_policies, v_e_traces, v_e_spans, v_now
            );
        exception when others then
            -- Undone: each of these items goes the single way below, and says why.
            v_done := array_fill(false, array[v_count]);
        end;
    end if;

    for i in 1 .. v_count loop
        item := i;
        task_id := v_ids[i];
        refused_sqlstate := null;
        refused_message := null;
        if v_done[i] then
            state := v_states[i];
            state_version := v_new_versions[i];
            fencing_token := v_new_tokens[i];
        else
            v_item := p_items -> (i - 1);
            begin
                v_task := keel.transition_task(
                    p_tenant_id,
                    v_ids[i],
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
                state := v_task.state;
                state_version := v_task.state_version;
                fencing_token := v_task.fencing_token;
            exception when others then
                get stacked diagnostics v_sqlstate = returned_sqlstate, v_message = message_text;
                refused_sqlstate := v_sqlstate;
                refused_message := v_message;
                state := null;
                state_version := null;
                fencing_token := null;
            end;
        end if;
        return next;
    end loop;
end;
$$;

comment on function keel.transition_tasks(uuid, jsonb) is
'A batch of keel.transition_task calls for one tenant in one round trip (G3). p_items is a jsonb array (at most settings.max_batch_items) of objects with task_id, expected_version, to_state and optionally fencing_token, event_type, payload, outbox, actor, policy_version, current_step, release_lease, wake_at. Each item has every guarantee of the single call; the result has one row per item, in order: refused_sqlstate and refused_message null and the new state, state_version and fencing_token on success, else (refused_sqlstate, refused_message) the SQLSTATE and message the single call would have raised, with nothing written for that item. Items with no payload, outbox message or wake time, each on a task no other item names, that pass the single call''s checks are written together in one UPDATE (their events after it); the others run as the single call, each in a subtransaction. A malformed batch raises invalid_argument (22K01) and writes nothing.';
