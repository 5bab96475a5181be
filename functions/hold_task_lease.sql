-- Leases with fencing (G5): a write fenced by a task's lease, without changing the task.
create or replace function keel.hold_task_lease(
    p_tenant_id uuid,
    p_task_id uuid,
    p_fencing_token bigint,
    p_now timestamptz
)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_task keel.tasks;
begin
    -- FOR SHARE keeps a concurrent claim from moving the lease until we commit.
    select t.* into v_task
    from keel.tasks as t
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id
    for share;
    if not found then
        raise exception using
            errcode = '42K04',
            message = format('task %s not found', p_task_id);
    end if;
    perform keel.assert_lease(v_task, p_fencing_token, p_now);
end;
$$;

comment on function keel.hold_task_lease(uuid, uuid, bigint, timestamptz) is
'Share-locks the task until commit and raises lease_lost (55K03) unless p_fencing_token is its current lease, task_not_found (42K04) when it is missing. Used by the operation functions, which write operations, not the task; not granted to any role.';
