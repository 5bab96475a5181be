-- Leases with fencing (G5): claim one named task.
create or replace function keel.claim_lease(
    p_tenant_id uuid,
    p_task_id uuid,
    p_owner text,
    p_lease interval default '30 seconds'
)
returns keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_task keel.tasks;
begin
    perform keel.require_tenant(p_tenant_id);
    v_expires := keel.check_lease_request(p_owner, p_lease, v_now);

    v_task := keel.lock_task(p_tenant_id, p_task_id);
    perform 1
    from keel.workflow_states as s
    where s.workflow = v_task.workflow
        and s.workflow_version = v_task.workflow_version
        and s.state = v_task.state
        and s.terminal;
    if found then
        raise exception using
            errcode = '55K06',
            message = format('task %s is in terminal state %s', p_task_id, v_task.state),
            hint = 'A finished task cannot be leased.';
    end if;
    if v_task.lease_expires_at > v_now then
        raise exception using
            errcode = '55K04',
            message = format('task %s is leased by %s', p_task_id, v_task.lease_owner),
            detail = format('The lease expires at %s.', v_task.lease_expires_at),
            hint = 'Wait for the lease to expire or be released, then claim again.';
    end if;

    return keel.claim_locked_task(v_task, p_owner, v_now, v_expires);
end;
$$;

comment on function keel.claim_lease(uuid, uuid, text, interval) is
'Leases the named task to p_owner for p_lease and returns it with a new fencing token (previous token + 1). Raises lease_held (55K04) while another unexpired lease exists, task_not_claimable (55K06) for a terminal task.';
