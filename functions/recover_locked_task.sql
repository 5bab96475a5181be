-- Leases with fencing (G5): take one stale task over, inside its tenant.
-- The caller (keel.recover_stale_tasks) has locked the row and set its tenant's context.
-- The takeover goes through keel.claim_locked_task, the one place a lease is granted, so
-- the fencing token increments and the dead worker's late writes get lease_lost from
-- keel.assert_lease; the recoverer's own lease ends at once (it never works on the task).
-- Then, in the same transaction, one event with the next per-task seq:
--   RECOVERED: recovery_attempts + 1, the lease released, the task due now, its state kept;
--   RECOVERY_EXHAUSTED (recovery_attempts already at the maximum): the task enters the
--   failure state (settings.recovery_failed_state) when its workflow version declares it,
--   else keeps its state; either way unleased and never due again.
create or replace function keel.recover_locked_task(
    p_task keel.tasks,
    p_now timestamptz,
    p_max_attempts integer,
    p_actor text default null
)
returns keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_failed_state text;
    v_exhausted boolean := p_task.recovery_attempts >= p_max_attempts;
    v_to_state text := p_task.state;
    v_attempts integer := p_task.recovery_attempts;
    v_wake_at timestamptz := p_now;
    v_event_type text := 'RECOVERED';
    v_next_version bigint := p_task.state_version + 1;
    v_seq bigint := p_task.last_event_seq + 1;
    v_task keel.tasks;
begin
    if v_exhausted then
        v_event_type := 'RECOVERY_EXHAUSTED';
        v_wake_at := null;
        select s.value into v_failed_state
        from keel.settings as s
        where s.setting = 'recovery_failed_state';
        perform 1
        from keel.workflow_states as w
        where w.workflow = p_task.workflow
            and w.workflow_version = p_task.workflow_version
            and w.state = v_failed_state;
        if found then
            v_to_state := v_failed_state;
        end if;
    else
        v_attempts := v_attempts + 1;
    end if;

    -- The takeover: the next fencing token, under a lease that is over as it starts.
    v_task := keel.claim_locked_task(p_task, 'keel.recover', p_now, p_now);

    update keel.tasks as t
    set
        state = v_to_state,
        state_version = v_next_version,
        last_event_seq = v_seq,
        recovery_attempts = v_attempts,
        lease_owner = null,
        lease_acquired_at = null,
        lease_expires_at = null,
        wake_at = v_wake_at,
        updated_at = p_now
    where t.tenant_id = p_task.tenant_id and t.task_id = p_task.task_id
    returning t.* into v_task;

    perform keel.append_event(
        v_task, v_event_type, p_task.state, p_now, v_task.fencing_token,
        jsonb_build_object(
            'previous_owner', p_task.lease_owner,
            'previous_fencing_token', p_task.fencing_token,
            'lease_expired_at', p_task.lease_expires_at,
            'recovery_attempts', v_attempts,
            'max_recovery_attempts', p_max_attempts
        ),
        p_actor
    );
    return v_task;
end;
$$;

comment on function keel.recover_locked_task(keel.tasks, timestamptz, integer, text) is
'Takes over one task whose lease expired, locked by the caller in its tenant''s context: the fencing token increments (keel.claim_locked_task), the state_version too, and one event is written with the next seq. RECOVERED: recovery_attempts + 1, unleased, due at p_now, state kept. RECOVERY_EXHAUSTED (recovery_attempts >= p_max_attempts): the failure state (settings.recovery_failed_state) if the workflow version declares it, else the state kept; unleased and never due. Shared by keel.recover_stale_tasks; not granted to any role.';
