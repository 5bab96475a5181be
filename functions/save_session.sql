-- Sessions: save a chat-loop session's snapshot, idempotently, its terminal status
-- protected (G3) and its state checked for secrets (G9).
create or replace function keel.save_session(
    p_tenant_id uuid,
    p_session_id text,
    p_state jsonb default '{}',
    p_status text default 'active',
    p_task_id uuid default null,
    p_expected_version bigint default null
)
returns keel.sessions
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_session keel.sessions;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_session_id is null or char_length(p_session_id) not between 1 and 200 then
        raise exception using errcode = '22K01', message = 'session id must be 1 to 200 characters';
    end if;
    if p_status is null or p_status not in ('active', 'completed', 'failed') then
        raise exception using
            errcode = '22K01',
            message = format('unknown session status %s', coalesce(p_status, 'null')),
            hint = 'A session is active, completed or failed.';
    end if;
    if p_state is null or jsonb_typeof(p_state) <> 'object' then
        raise exception using errcode = '22K01', message = 'session state must be a jsonb object';
    end if;
    perform keel.check_payload('session state', p_state, 'max_session_state_bytes');
    if p_task_id is not null then
        perform 1 from keel.tasks as t where t.tenant_id = p_tenant_id and t.task_id = p_task_id;
        if not found then
            raise exception using
                errcode = '42K04',
                message = format('task %s not found', p_task_id);
        end if;
    else
        perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id;
        if not found then
            raise exception using
                errcode = '42K02',
                message = format('unknown tenant %s', p_tenant_id);
        end if;
    end if;

    -- A new session counts against the tenant's quota; a save of one it has, never.
    if not exists (
        select 1
        from keel.sessions as s
        where s.tenant_id = p_tenant_id and s.session_id = p_session_id
    ) then
        perform keel.check_quota(p_tenant_id, null, 'max_tenant_sessions', 1);
    end if;

    insert into keel.sessions as s (
        tenant_id, session_id, task_id, state, status, state_version, last_update_seq,
        created_at, updated_at
    )
    values (
        p_tenant_id, p_session_id, p_task_id, p_state, p_status, 1, 0, v_now, v_now
    )
    on conflict on constraint sessions_pkey do nothing
    returning s.* into v_session;
    if found then
        if p_expected_version is not null and p_expected_version <> 0 then
            -- Created just now: the caller expected a session that did not exist.
            raise exception using
                errcode = '55K16',
                message = format('session %s did not exist', p_session_id),
                detail = format('Expected version %s; pass 0 or nothing to create it.', p_expected_version),
                hint = 'Load the session, then save with the version you read.';
        end if;
        return v_session;
    end if;

    -- The row lock orders every writer of this session: the checks below cannot go stale.
    select s.* into v_session
    from keel.sessions as s
    where s.tenant_id = p_tenant_id and s.session_id = p_session_id
    for update;
    if not found then
        raise exception using
            errcode = '40001',
            message = format('session %s is being created concurrently', p_session_id),
            hint = 'Retry the transaction.';
    end if;

    -- The same snapshot again: a replay, nothing changes.
    if v_session.state = p_state and v_session.status = p_status
        and v_session.task_id is not distinct from coalesce(p_task_id, v_session.task_id) then
        return v_session;
    end if;
    if p_expected_version is not null and p_expected_version <> v_session.state_version then
        raise exception using
            errcode = '55K16',
            message = format('session %s changed since version %s', p_session_id, p_expected_version),
            detail = format('The session is at version %s (status %s).', v_session.state_version, v_session.status),
            hint = 'Another writer saved first. Load the session again and decide again.';
    end if;
    if v_session.status in ('completed', 'failed') and p_status = 'active' then
        raise exception using
            errcode = '55K15',
            message = format('session %s is %s: it cannot become active again', p_session_id, v_session.status),
            detail = 'A completed or failed session is never overwritten by a non-terminal save. Nothing was written.',
            hint = 'Start a new session, or save a terminal status (completed / failed) to replace the outcome.';
    end if;
    if p_task_id is not null and v_session.task_id is not null and p_task_id <> v_session.task_id then
        raise exception using
            errcode = '22K01',
            message = format('session %s belongs to task %s', p_session_id, v_session.task_id),
            hint = 'A session''s task is set once.';
    end if;

    update keel.sessions as s
    set
        state = p_state,
        status = p_status,
        task_id = coalesce(p_task_id, v_session.task_id),
        state_version = v_session.state_version + 1,
        updated_at = v_now
    where s.tenant_id = p_tenant_id and s.session_id = p_session_id
    returning s.* into v_session;
    return v_session;
end;
$$;

comment on function keel.save_session(uuid, text, jsonb, text, uuid, bigint) is
'Creates or replaces the snapshot of a chat-loop session (state object, status active / completed / failed, optional task) under the session row''s lock. Saving the stored snapshot again changes nothing (idempotent); any other change increments state_version. p_expected_version (0: must not exist yet) refuses a save over a newer version with session_version_conflict (55K16). A completed or failed session is never made active again (session_update_refused, 55K15); a terminal status may replace the other one. The state passes keel.check_payload (G9). A save that would create a session past the tenant''s max_tenant_sessions is refused with quota_exceeded (54K01). Nothing is written on any error.';
