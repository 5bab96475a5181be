-- Reads without table access (G1): one operation of the caller's tenant.
create or replace function keel.get_operation(p_tenant_id uuid, p_operation_id uuid)
returns setof keel.operations
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    return query
    select o.*
    from keel.operations as o
    where o.tenant_id = p_tenant_id and o.operation_id = p_operation_id;
end;
$$;

comment on function keel.get_operation(uuid, uuid) is
'The operation, or no row, in the tenant of the current context (G1, G2).';
