-- Reads without table access (G1): a page of the caller's tenant's tasks.
create or replace function keel.list_tasks(
    p_tenant_id uuid,
    p_state text default null,
    p_after_task_id uuid default null,
    p_limit integer default 100
)
returns setof keel.tasks
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    if p_limit is null or p_limit not between 1 and 1000 then
        raise exception using errcode = '22K01', message = 'page size must be 1 to 1000';
    end if;
    return query
    select t.*
    from keel.tasks as t
    where t.tenant_id = p_tenant_id
        and (p_state is null or t.state = p_state)
        and (p_after_task_id is null or t.task_id > p_after_task_id)
    order by t.task_id
    limit p_limit;
end;
$$;

comment on function keel.list_tasks(uuid, text, uuid, integer) is
'Up to p_limit (1-1000) tasks of the tenant of the current context, optionally in one state, ordered by task_id (time-ordered uuid v7 when the database made the id); pass the last task_id seen as p_after_task_id for the next page.';
