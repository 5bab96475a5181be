-- Reads without table access (G1): one task of the caller's tenant.
create or replace function keel.get_task(p_tenant_id uuid, p_task_id uuid)
returns setof keel.tasks
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    return query
    select t.*
    from keel.tasks as t
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id;
end;
$$;

comment on function keel.get_task(uuid, uuid) is
'The task, or no row, in the tenant of the current context. Agents read through functions like this one, which take no free-form predicate: they have no table privilege, so they cannot probe other tenants'' planner statistics (G1).';
