-- The instance layer: lock one task row of a tenant, or say it is missing. The one lookup
-- of a task by the functions that change it (FOR UPDATE) or that write under its lease
-- without changing it (FOR SHARE, then keel.assert_lease).
-- Replaces the two-argument lock_task and keel.hold_task_lease (its share-locking twin).
drop function if exists keel.lock_task(uuid, uuid);
drop function if exists keel.hold_task_lease(uuid, uuid, bigint, timestamptz);

create or replace function keel.lock_task(
    p_tenant_id uuid,
    p_task_id uuid,
    p_strength text default 'update'
)
returns keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
-- A primary-key lookup: a plan made while keel.tasks was nearly empty (a sequential scan)
-- must not stay in use as the table grows.
set enable_seqscan = off
as $$
declare
    v_task keel.tasks;
begin
    if p_strength = 'update' then
        select t.* into v_task
        from keel.tasks as t
        where t.tenant_id = p_tenant_id and t.task_id = p_task_id
        for update;
    elsif p_strength = 'share' then
        select t.* into v_task
        from keel.tasks as t
        where t.tenant_id = p_tenant_id and t.task_id = p_task_id
        for share;
    else
        raise exception using
            errcode = '22K01',
            message = format('unknown lock strength %s', p_strength),
            hint = 'Use update or share.';
    end if;
    if not found then
        raise exception using
            errcode = '42K04',
            message = format('task %s not found', p_task_id);
    end if;
    return v_task;
end;
$$;

comment on function keel.lock_task(uuid, uuid, text) is
'Locks the task row (p_strength update: FOR UPDATE, to change it; share: FOR SHARE, so a concurrent claim cannot move its lease until commit) and returns it; raises task_not_found (42K04) when the tenant has no such task. Shared by the functions that change a task or write under its lease; not granted to any role.';
