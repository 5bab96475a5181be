-- Tenant deletion (G10): how many rows a tenant has in each tenant table, in the order
-- keel.delete_tenant removes them, keel.tenants last: what `agentkeel tenant delete
-- --dry-run` prints and what its progress counts down from. One count per table.
-- agentkeel:requires functions/tenant_deletion_order.sql
create or replace function keel.tenant_rows(p_tenant_id uuid)
returns table (relation text, row_count bigint)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_table record;
begin
    if p_tenant_id is null or p_tenant_id = keel.no_tenant() then
        raise exception using errcode = '22K01', message = 'a tenant id (not the nil uuid) is required';
    end if;
    for v_table in select o.relation from keel.tenant_deletion_order() as o loop
        relation := v_table.relation::text;
        execute format('select count(*) from %s as t where t.tenant_id = $1', v_table.relation)
        into row_count using p_tenant_id;
        return next;
    end loop;
    relation := 'keel.tenants';
    select count(*) into row_count from keel.tenants as t where t.tenant_id = p_tenant_id;
    return next;
end;
$$;

comment on function keel.tenant_rows(uuid) is
'The tenant''s rows per tenant table, in the order keel.delete_tenant removes them (keel.tenants last). Reads under row-level security: run it in a transaction whose tenant context is p_tenant_id (agentkeel tenant delete --dry-run sets it). Owner only.';
