-- Reads without table access (G1): a task's events, in order.
create or replace function keel.task_history(
    p_tenant_id uuid,
    p_task_id uuid,
    p_after_seq bigint default 0,
    p_limit integer default 100
)
returns setof keel.task_events
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
    select e.*
    from keel.task_events as e
    where e.tenant_id = p_tenant_id
        and e.task_id = p_task_id
        and e.seq > coalesce(p_after_seq, 0)
    order by e.seq
    limit p_limit;
end;
$$;

comment on function keel.task_history(uuid, uuid, bigint, integer) is
'Up to p_limit (1-1000) events of a task of the tenant of the current context with seq > p_after_seq, in seq order; pass the last seq seen for the next page.';
