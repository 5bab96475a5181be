-- Reads without table access (G1, G8): the attempts of a task's steps.
create or replace function keel.list_step_attempts(p_tenant_id uuid, p_task_id uuid)
returns setof keel.step_attempts
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    return query
    select a.*
    from keel.step_attempts as a
    where a.tenant_id = p_tenant_id and a.task_id = p_task_id
    order by a.started_at, a.step_key, a.attempt
    limit 10000;
end;
$$;

comment on function keel.list_step_attempts(uuid, uuid) is
'Every attempt of every step of the task, in the order they started (at most 10,000), in the tenant of the current context (G1, G8).';
