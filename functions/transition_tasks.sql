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
    -- The plain items' task rows as locked (the columns the checks read), and the rows
    -- the set path wrote.
    v_l_ids uuid[];
    v_l_workflows text[];
    v_l_versions integer[];
    v_l_states text[];
    v_l_state_versions bigint[];
    v_l_owners text[];
    v_l_tokens bigint[];
    v_l_expires timestamptz[];
    v_w_ids uuid[] := '{}';
    v_w_seqs bigint[] := '{}';
    v_w_states text[] := '{}';
    v_w_versions bigint[] := '{}';
    v_w_tokens bigint[] := '{}';
    v_w_traces text[] := '{}';
    v_w_spans text[] := '{}';
    -- A group of the set path's tasks that go the same way, and its values.
    v_group record;
    v_g_state text;
    v_g_terminal boolean;
    v_g_keep boolean;
    v_g_step text;
    v_g_ids uuid[];
    -- The events of the set path, event i from item i of each (keel.append_events).
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
    -- The items read in one pass. The plain ones: fields of the expected JSON types
    -- (anything else the single call parses, or refuses, itself), an empty payload, no
    -- outbox message, no wake time, and a task named by no other item (the single calls
    -- then run in item order); only their fields are read here, so no cast below fails.
    begin
        select
            array_agg(p.plain order by p.n),
            array_agg(p.task_id order by p.n),
            array_agg(case when p.plain then (p.value ->> 'expected_version')::bigint end order by p.n),
            array_agg(case when p.plain then p.value ->> 'to_state' end order by p.n),
            array_agg(case when p.plain then (p.value ->> 'fencing_token')::bigint end order by p.n),
            array_agg(
                case when p.plain then coalesce(p.value ->> 'event_type', 'transition') end
                order by p.n
            ),
            array_agg(case when p.plain then p.value ->> 'actor' end order by p.n),
            array_agg(case when p.plain then p.value ->> 'policy_version' end order by p.n),
            array_agg(case when p.plain then p.value ->> 'current_step' end order by p.n),
            array_agg(
                case when p.plain then coalesce((p.value ->> 'release_lease')::boolean, false) end
                order by p.n
            )
        into v_plain, v_ids, v_versions, v_to_states, v_tokens, v_event_types, v_actors,
            v_policies, v_steps, v_releases
        from (
            select
                i.n, i.value, i.task_id,
                jsonb_typeof(i.value -> 'expected_version') = 'number'
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
                and count(*) over (partition by i.task_id) = 1 as plain
            from (
                select e.value, e.n, (e.value ->> 'task_id')::uuid as task_id
                from jsonb_array_elements(p_items) with ordinality as e (value, n)
            ) as i
        ) as p;
    exception when invalid_text_representation then
        raise exception using
            errcode = '22K01',
            message = 'every batch item''s task_id must be a uuid',
            detail = 'Nothing of the batch was run.';
    end;

    v_done := array_fill(false, array[v_count]);
    if v_count > 0 and true = any(v_plain) then
        v_plain_ids := array(
            select v_ids[n] from generate_subscripts(v_ids, 1) as n where v_plain[n]
        );
        -- Their tasks locked in one statement, in task order, waiting for any another
        -- transaction holds (usually briefly: a claim of another worker that locked a
        -- task it then found leased, which PostgreSQL keeps locked until that claim
        -- commits). Batches lock in the same order, so two never deadlock each other. If
        -- the wait ends in a lock timeout, a deadlock with some other transaction, or
        -- (under REPEATABLE READ) a row changed since the snapshot, that statement's locks
        -- are released with it and every item goes the single way below, which refuses
        -- each for what it meets there, item by item, as the single call does. Then, in
        -- one statement over the locked rows, the checks of keel.transition_task on each,
        -- as of now: the lease (keel.assert_lease), the version, the edge
        -- (keel.edge_terminal, once per distinct edge). An item that fails one goes the
        -- single way too, which refuses it for that reason. (Columns, not whole rows: on
        -- Citus a whole row reads as the shard's row type.)
        v_now := clock_timestamp();
        begin
            select
                coalesce(array_agg(l.task_id), '{}'), array_agg(l.workflow),
                array_agg(l.workflow_version), array_agg(l.state), array_agg(l.state_version),
                array_agg(l.lease_owner), array_agg(l.fencing_token), array_agg(l.lease_expires_at)
            into v_l_ids, v_l_workflows, v_l_versions, v_l_states, v_l_state_versions,
                v_l_owners, v_l_tokens, v_l_expires
            from (
                select
                    t.task_id, t.workflow, t.workflow_version, t.state, t.state_version,
                    t.lease_owner, t.fencing_token, t.lease_expires_at
                from keel.tasks as t
                where t.tenant_id = p_tenant_id and t.task_id = any(v_plain_ids)
                order by t.task_id
                for update
            ) as l;
        exception when lock_not_available or deadlock_detected or serialization_failure then
            v_l_ids := '{}';  -- nothing locked: every item goes the single way
        end;
        with checked as materialized (
            select
                i.n, l.task_id, l.workflow, l.workflow_version, l.state, i.to_state,
                i.token is not null and not i.release as may_keep
            from unnest(
                v_l_ids, v_l_workflows, v_l_versions, v_l_states, v_l_state_versions,
                v_l_owners, v_l_tokens, v_l_expires
            ) as l (
                task_id, workflow, workflow_version, state, state_version, lease_owner,
                fencing_token, lease_expires_at
            )
            inner join unnest(v_ids, v_versions, v_tokens, v_to_states, v_releases, v_plain)
                with ordinality as i (task_id, version, token, to_state, release, plain, n)
                on i.task_id = l.task_id and i.plain
            where l.state_version = i.version
                and case
                    when i.token is null then not coalesce(l.lease_expires_at > v_now, false)
                    else l.lease_owner is not null
                        and l.fencing_token = i.token
                        and coalesce(l.lease_expires_at > v_now, false)
                end
        ),
        -- Each distinct edge looked up once (a batch of a worker's tasks has one).
        edges as materialized (
            select
                d.workflow, d.workflow_version, d.state, d.to_state,
                keel.edge_terminal(d.workflow, d.workflow_version, d.state, d.to_state)
                    as terminal
            from (
                select distinct c.workflow, c.workflow_version, c.state, c.to_state
                from checked as c
            ) as d
        )
        select
            coalesce(array_agg(c.n order by c.n), '{}'),
            coalesce(array_agg(c.task_id order by c.n), '{}'),
            coalesce(array_agg(c.state order by c.n), '{}'),
            coalesce(array_agg(e.terminal order by c.n), '{}'),
            coalesce(array_agg(c.may_keep and not e.terminal order by c.n), '{}')
        into v_set_items, v_set_ids, v_set_from, v_set_terminal, v_set_keep
        from checked as c
        inner join edges as e
            on e.workflow = c.workflow
            and e.workflow_version = c.workflow_version
            and e.state = c.state
            and e.to_state = c.to_state
        where e.terminal is not null;
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
                    v_w_ids := v_w_ids || v_task.task_id;
                    v_w_seqs := v_w_seqs || v_task.last_event_seq;
                    v_w_states := v_w_states || v_task.state;
                    v_w_versions := v_w_versions || v_task.state_version;
                    v_w_tokens := v_w_tokens || v_task.fencing_token;
                    v_w_traces := v_w_traces || v_task.trace_id;
                    v_w_spans := v_w_spans || v_task.span_id;
                end loop;
            end loop;
            -- What each written row's event holds (its item's event type, token, actor and
            -- policy version, the state it came from), in item order; and, per item, what
            -- the batch returns for it.
            select
                array_agg(u.task_id order by s.n), array_agg(u.last_event_seq order by s.n),
                array_agg(v_event_types[s.n] order by s.n), array_agg(s.from_state order by s.n),
                array_agg(u.state order by s.n), array_agg(u.state_version order by s.n),
                array_agg(v_tokens[s.n] order by s.n), array_agg('{}'::jsonb order by s.n),
                array_agg(v_actors[s.n] order by s.n), array_agg(v_policies[s.n] order by s.n),
                array_agg(u.trace_id order by s.n), array_agg(u.span_id order by s.n)
            into v_e_tasks, v_e_seqs, v_e_types, v_e_from, v_e_to, v_e_versions, v_e_tokens,
                v_e_payloads, v_e_actors, v_e_policies, v_e_traces, v_e_spans
            from unnest(
                v_w_ids, v_w_seqs, v_w_states, v_w_versions, v_w_tokens, v_w_traces, v_w_spans
            ) as u (task_id, last_event_seq, state, state_version, fencing_token, trace_id, span_id)
            inner join unnest(v_set_items, v_set_ids, v_set_from) as s (n, task_id, from_state)
                on s.task_id = u.task_id;
            select
                array_agg(w.task_id is not null order by g.n), array_agg(w.state order by g.n),
                array_agg(w.state_version order by g.n), array_agg(w.fencing_token order by g.n)
            into v_done, v_states, v_new_versions, v_new_tokens
            from generate_series(1, v_count) as g (n)
            left join (
                select s.n, u.task_id, u.state, u.state_version, u.fencing_token
                from unnest(v_w_ids, v_w_states, v_w_versions, v_w_tokens)
                    as u (task_id, state, state_version, fencing_token)
                inner join unnest(v_set_items, v_set_ids) as s (n, task_id)
                    on s.task_id = u.task_id
            ) as w on w.n = g.n;
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

    if v_count > 0 and false <> all(v_done) then
        -- Every item written together: the rows in one statement.
        return query
        select g.n, v_ids[g.n], null::text, null::text, v_states[g.n], v_new_versions[g.n],
            v_new_tokens[g.n]
        from generate_series(1, v_count) as g (n);
        return;
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
