-- Workflow versions and their legal edges (G3). Versions are immutable.
create or replace function keel.define_workflow(
    p_workflow text,
    p_workflow_version integer,
    p_initial_state text,
    p_transitions jsonb,
    p_description text default null
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
    v_bad jsonb;
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
    select e.value into v_bad
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
            detail = format('Offending element: %s', left(v_bad::text, 200));
    end if;

    select array_agg(distinct (e.value ->> 0) || ' -> ' || (e.value ->> 1) order by (e.value ->> 0) || ' -> ' || (e.value ->> 1))
    into v_edges
    from jsonb_array_elements(p_transitions) as e (value);

    select w.* into v_existing
    from keel.workflows as w
    where w.workflow = p_workflow and w.workflow_version = p_workflow_version
    for update;
    if found then
        select array_agg(t.from_state || ' -> ' || t.to_state order by t.from_state || ' -> ' || t.to_state)
        into v_stored_edges
        from keel.workflow_transitions as t
        where t.workflow = p_workflow and t.workflow_version = p_workflow_version;
        if v_existing.initial_state is distinct from p_initial_state
            or coalesce(v_stored_edges, '{}') is distinct from coalesce(v_edges, '{}') then
            raise exception using
                errcode = '23K02',
                message = format(
                    'workflow %s version %s is already defined differently',
                    p_workflow, p_workflow_version
                ),
                detail = 'Its initial state or its set of edges differs from the stored definition.',
                hint = 'Workflow versions are immutable: running tasks are pinned to them. Define a new version.';
        end if;
        return false;
    end if;

    insert into keel.workflows (workflow, workflow_version, initial_state, description)
    values (p_workflow, p_workflow_version, p_initial_state, p_description);
    insert into keel.workflow_transitions (workflow, workflow_version, from_state, to_state)
    select distinct p_workflow, p_workflow_version, e.value ->> 0, e.value ->> 1
    from jsonb_array_elements(p_transitions) as e (value);
    return true;
end;
$$;

comment on function keel.define_workflow(text, integer, text, jsonb, text) is
'Defines a workflow version: its initial state and legal edges, e.g. ''[["queued","running"],["running","done"]]''. Returns true when created, false when the identical definition already exists; a different definition of an existing version raises workflow_conflict (23K02).';
