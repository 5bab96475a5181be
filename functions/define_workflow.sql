-- Workflow versions, their legal edges and their terminal states (G3). Versions are immutable.
-- The five-argument version is replaced by this one (p_terminal_states added, defaulted).
drop function if exists keel.define_workflow(text, integer, text, jsonb, text);

create or replace function keel.define_workflow(
    p_workflow text,
    p_workflow_version integer,
    p_initial_state text,
    p_transitions jsonb,
    p_description text default null,
    p_terminal_states text[] default null
)
returns boolean
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_existing keel.workflows;
    v_edges text[];
    v_stored_edges text[];
    v_states text[];
    v_sources text[];
    v_terminal text[];
    v_stored_terminal text[];
    v_bad text;
    v_bad_edge jsonb;
begin
    if p_workflow is null or p_workflow_version is null or p_initial_state is null then
        raise exception using
            errcode = '22K01',
            message = 'workflow, workflow_version and initial_state are required';
    end if;
    if p_transitions is null or jsonb_typeof(p_transitions) <> 'array' then
        raise exception using
            errcode = '22K01',
            message = 'transitions must be a jsonb array of [from_state, to_state] pairs';
    end if;
    select e.value into v_bad_edge
    from jsonb_array_elements(p_transitions) as e (value)
    where jsonb_typeof(e.value) <> 'array'
        or jsonb_array_length(e.value) <> 2
        or jsonb_typeof(e.value -> 0) <> 'string'
        or jsonb_typeof(e.value -> 1) <> 'string'
    limit 1;
    if found then
        raise exception using
            errcode = '22K01',
            message = 'each transition must be a [from_state, to_state] pair of strings',
            detail = format('Offending element: %s', left(v_bad_edge::text, 200));
    end if;

    select array_agg(distinct (e.value ->> 0) || ' -> ' || (e.value ->> 1) order by (e.value ->> 0) || ' -> ' || (e.value ->> 1))
    into v_edges
    from jsonb_array_elements(p_transitions) as e (value);

    -- Every state: the initial one and both ends of every edge; sources have an edge out.
    select array_agg(distinct e.value ->> 0 order by e.value ->> 0)
    into v_sources
    from jsonb_array_elements(p_transitions) as e (value);
    select array_agg(distinct s.state order by s.state)
    into v_states
    from (
        select p_initial_state as state
        union all
        select e.value ->> 0 from jsonb_array_elements(p_transitions) as e (value)
        union all
        select e.value ->> 1 from jsonb_array_elements(p_transitions) as e (value)
    ) as s;
    -- The one definition of terminal: a state with no outgoing edge. A caller may declare
    -- the terminal states; then every other state needs an edge out (no dead end).
    select coalesce(array_agg(s.state order by s.state), '{}')
    into v_terminal
    from unnest(v_states) as s (state)
    where s.state <> all(coalesce(v_sources, '{}'));

    select w.* into v_existing
    from keel.workflows as w
    where w.workflow = p_workflow and w.workflow_version = p_workflow_version
    for update;
    if found then
        select array_agg(t.from_state || ' -> ' || t.to_state order by t.from_state || ' -> ' || t.to_state)
        into v_stored_edges
        from keel.workflow_transitions as t
        where t.workflow = p_workflow and t.workflow_version = p_workflow_version;
        select coalesce(array_agg(s.state order by s.state), '{}')
        into v_stored_terminal
        from keel.workflow_states as s
        where s.workflow = p_workflow and s.workflow_version = p_workflow_version and s.terminal;
        if v_existing.initial_state is distinct from p_initial_state
            or coalesce(v_stored_edges, '{}') is distinct from coalesce(v_edges, '{}')
            or (
                p_terminal_states is not null
                and v_stored_terminal is distinct from array(
                    select distinct d.state from unnest(p_terminal_states) as d (state)
                    order by d.state
                )
            ) then
            raise exception using
                errcode = '23K02',
                message = format(
                    'workflow %s version %s is already defined differently',
                    p_workflow, p_workflow_version
                ),
                detail = 'Its initial state, its set of edges or its terminal states differ from the stored definition.',
                hint = 'Workflow versions are immutable: running tasks are pinned to them. Define a new version.';
        end if;
        return false;
    end if;

    if p_terminal_states is not null then
        select d.state into v_bad
        from unnest(p_terminal_states) as d (state)
        where d.state is null or d.state <> all(v_states)
        limit 1;
        if found then
            raise exception using
                errcode = '22K01',
                message = format('terminal state %s is not a state of the workflow', v_bad),
                hint = 'A terminal state is the initial state or the target of an edge.';
        end if;
        select d.state into v_bad
        from unnest(p_terminal_states) as d (state)
        where d.state = any(coalesce(v_sources, '{}'))
        limit 1;
        if found then
            raise exception using
                errcode = '22K01',
                message = format('terminal state %s has an outgoing edge', v_bad),
                hint = 'A task never leaves a terminal state: remove its edges or the declaration.';
        end if;
        select s.state into v_bad
        from unnest(v_terminal) as s (state)
        where s.state <> all(p_terminal_states)
        limit 1;
        if found then
            raise exception using
                errcode = '22K01',
                message = format('state %s is a dead end but not declared terminal', v_bad),
                detail = 'A task entering it could never move again nor finish.',
                hint = 'Add an edge out of it, or list it in p_terminal_states.';
        end if;
    end if;
    -- Every state is reachable from the initial one: an unreachable state is a typo.
    with recursive reachable (state) as (
        select p_initial_state
        union
        select e.value ->> 1
        from reachable as r
        inner join jsonb_array_elements(p_transitions) as e (value) on e.value ->> 0 = r.state
    )
    select s.state into v_bad
    from unnest(v_states) as s (state)
    where s.state not in (select r.state from reachable as r)
    order by s.state
    limit 1;
    if found then
        raise exception using
            errcode = '22K01',
            message = format('state %s is unreachable from initial state %s', v_bad, p_initial_state),
            hint = 'Every state must be reachable along the edges from the initial state.';
    end if;

    insert into keel.workflows (workflow, workflow_version, initial_state, description)
    values (p_workflow, p_workflow_version, p_initial_state, p_description);
    insert into keel.workflow_transitions (workflow, workflow_version, from_state, to_state)
    select distinct p_workflow, p_workflow_version, e.value ->> 0, e.value ->> 1
    from jsonb_array_elements(p_transitions) as e (value);
    insert into keel.workflow_states (workflow, workflow_version, state, terminal)
    select p_workflow, p_workflow_version, s.state, s.state = any(v_terminal)
    from unnest(v_states) as s (state);
    return true;
end;
$$;

comment on function keel.define_workflow(text, integer, text, jsonb, text, text[]) is
'Defines a workflow version: its initial state and legal edges, e.g. ''[["queued","running"],["running","done"]]'', and stores its states in keel.workflow_states with the terminal ones (no outgoing edge) marked. When p_terminal_states is given, every state with no outgoing edge must be listed there and no listed state may have one; every state must be reachable from the initial state (else invalid_argument, 22K01). Returns true when created, false when the identical definition already exists; a different definition of an existing version raises workflow_conflict (23K02).';
