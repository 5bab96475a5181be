-- The instance layer: start a task in its workflow's initial state, with event 1.
create or replace function keel.create_task(
    p_tenant_id uuid,
    p_workflow text,
    p_workflow_version integer,
    p_task_id uuid default null,
    p_wake_at timestamptz default null,
    p_metadata jsonb default '{}',
    p_actor text default null,
    p_trace_id text default null,
    p_span_id text default null
)
returns keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_task_id uuid := coalesce(p_task_id, keel.uuid_v7());
    v_wake_at timestamptz;
    v_initial_state text;
    v_terminal boolean;
    v_task keel.tasks;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_metadata is not null and jsonb_typeof(p_metadata) <> 'object' then
        raise exception using errcode = '22K01', message = 'task metadata must be a jsonb object';
    end if;
    perform keel.check_payload('task metadata', p_metadata, 'max_task_metadata_bytes');
    v_wake_at := keel.check_wake_at(p_wake_at, v_now);
    perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id;
    if not found then
        raise exception using
            errcode = '42K02',
            message = format('unknown tenant %s', p_tenant_id),
            hint = 'Create it with keel.create_tenant first.';
    end if;
    select w.initial_state, s.terminal into v_initial_state, v_terminal
    from keel.workflows as w
    inner join keel.workflow_states as s
        on s.workflow = w.workflow
        and s.workflow_version = w.workflow_version
        and s.state = w.initial_state
    where w.workflow = p_workflow and w.workflow_version = p_workflow_version;
    if not found then
        raise exception using
            errcode = '42K03',
            message = format('unknown workflow %s version %s', p_workflow, p_workflow_version),
            hint = 'Define it with keel.define_workflow first.';
    end if;
    if v_terminal then
        v_wake_at := null;  -- born finished: never due, never leased
    end if;

    insert into keel.tasks (
        tenant_id, task_id, workflow, workflow_version, state, state_version,
        last_event_seq, wake_at, metadata, trace_id, span_id, created_at, updated_at
    )
    values (
        p_tenant_id, v_task_id, p_workflow, p_workflow_version, v_initial_state, 1,
        1, v_wake_at, coalesce(p_metadata, '{}'), p_trace_id, p_span_id,
        v_now, v_now
    )
    returning * into v_task;

    perform keel.append_event(v_task, 'created', null, v_now, p_claimed_actor => p_actor);
    return v_task;
end;
$$;

comment on function keel.create_task(uuid, text, integer, uuid, timestamptz, jsonb, text, text, text) is
'Creates a task in the initial state of its workflow version, due at p_wake_at (default now; see keel.check_wake_at) unless that state is terminal (keel.workflow_states), in which case it is never due, and writes its first event (seq 1, type created, actor the login, p_actor as claimed_actor) in the same transaction. Metadata passes keel.check_payload (G9).';
