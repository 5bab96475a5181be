-- The instance layer: lock one task row of a tenant for an update, or say it is missing.
create or replace function keel.lock_task(p_tenant_id uuid, p_task_id uuid)
returns keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_task keel.tasks;
begin
    select t.* into v_task
    from keel.tasks as t
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id
    for update;
    if not found then
        raise exception using
            errcode = '42K04',
            message = format('task %s not found', p_task_id);
    end if;
    return v_task;
end;
$$;

comment on function keel.lock_task(uuid, uuid) is
'Locks the task row FOR UPDATE and returns it; raises task_not_found (42K04) when the tenant has no such task. Shared by the functions that change a task; not granted to any role.';
