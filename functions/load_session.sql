-- Sessions: a chat-loop session as its agent resumes it, the snapshot with its step
-- updates merged in seq order (reads without table access, like keel.get_task).
create or replace function keel.load_session(p_tenant_id uuid, p_session_id text)
returns table (
    session_id text,
    task_id uuid,
    state jsonb,
    status text,
    state_version bigint,
    last_update_seq bigint,
    steps jsonb,
    created_at timestamptz,
    updated_at timestamptz
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_session keel.sessions;
    v_steps jsonb;
begin
    perform keel.require_tenant(p_tenant_id);
    select s.* into v_session
    from keel.sessions as s
    where s.tenant_id = p_tenant_id and s.session_id = p_session_id;
    if not found then
        return;
    end if;

    -- Updates applied in seq order, a later one replacing an earlier one of its step: the
    -- latest of each step. keel.record_session_update stored only updates its rules let
    -- through, so this fold never lets a running update replace a completed or failed one.
    select coalesce(jsonb_object_agg(
        l.step_key,
        jsonb_build_object(
            'status', l.status,
            'attempt', l.attempt,
            'result', l.result,
            'error', l.error,
            'seq', l.seq,
            'updated_at', l.created_at
        )
    ), '{}'::jsonb)
    into v_steps
    from (
        select distinct on (u.step_key)
            u.step_key, u.status, u.attempt, u.result, u.error, u.seq, u.created_at
        from keel.session_updates as u
        where u.tenant_id = p_tenant_id and u.session_id = p_session_id
        order by u.step_key asc, u.seq desc
    ) as l;

    return query select
        v_session.session_id, v_session.task_id, v_session.state, v_session.status,
        v_session.state_version, v_session.last_update_seq, v_steps, v_session.created_at,
        v_session.updated_at;
end;
$$;

comment on function keel.load_session(uuid, text) is
'The session of the current tenant with its step updates merged in seq order: steps is an object of step_key -> {status, attempt, result, error, seq, updated_at}, the latest applied update of each step. No row when the session does not exist.';
