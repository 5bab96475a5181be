-- Leases with fencing (G5): extend a lease still held.
create or replace function keel.renew_lease(
    p_tenant_id uuid,
    p_task_id uuid,
    p_fencing_token bigint,
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
    v_task := keel.lock_task(p_tenant_id, p_task_id);
    perform keel.assert_lease(v_task, p_fencing_token, v_now);
    v_expires := keel.check_lease_request(v_task.lease_owner, p_lease, v_now);

    update keel.tasks as t
    set
        lease_expires_at = v_expires,
        wake_at = v_expires,
        updated_at = v_now
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id
    returning t.* into v_task;
    return v_task;
end;
$$;

comment on function keel.renew_lease(uuid, uuid, bigint, interval) is
'Extends a valid lease to now + p_lease. Raises lease_lost (55K03) when the token is not the current unexpired lease: an expired lease cannot be revived, claim again.';
