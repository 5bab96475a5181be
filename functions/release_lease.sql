-- Leases with fencing (G5): give a lease back.
create or replace function keel.release_lease(
    p_tenant_id uuid,
    p_task_id uuid,
    p_fencing_token bigint,
    p_wake_at timestamptz default null
)
returns keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_wake_at timestamptz;
    v_task keel.tasks;
begin
    perform keel.require_tenant(p_tenant_id);
    v_task := keel.lock_task(p_tenant_id, p_task_id);
    perform keel.assert_lease(v_task, p_fencing_token, v_now);
    v_wake_at := keel.check_wake_at(p_wake_at, v_now);

    update keel.tasks as t
    set
        lease_owner = null,
        lease_acquired_at = null,
        lease_expires_at = null,
        wake_at = v_wake_at,
        updated_at = v_now
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id
    returning t.* into v_task;
    return v_task;
end;
$$;

comment on function keel.release_lease(uuid, uuid, bigint, timestamptz) is
'Releases a valid lease; the task is due again at p_wake_at (default now; see keel.check_wake_at). The fencing token is not reset: the next claim gets a higher one.';
