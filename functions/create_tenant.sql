-- Tenancy: create a tenant (idempotent on its id).
create or replace function keel.create_tenant(
    p_tenant_id uuid,
    p_name text
)
returns keel.tenants
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant keel.tenants;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_name is null or char_length(p_name) not between 1 and 200 then
        raise exception using
            errcode = '22K01',
            message = 'tenant name must be 1 to 200 characters';
    end if;
    insert into keel.tenants (tenant_id, name)
    values (p_tenant_id, p_name)
    on conflict on constraint tenants_pkey do nothing;
    select t.* into v_tenant from keel.tenants as t where t.tenant_id = p_tenant_id;
    return v_tenant;
end;
$$;

comment on function keel.create_tenant(uuid, text) is
'Creates the tenant if it does not exist, and returns its row. Calling it again with the same id returns the existing row unchanged.';
