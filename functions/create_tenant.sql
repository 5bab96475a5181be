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
    v_created integer;
    v_slot integer;
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
    get diagnostics v_created = row_count;
    if v_created = 1 then
        -- A new tenant has no pending message: its counter's base is 0, and its first 16
        -- slots exist, so that its writers take free ones and never wait on another's new
        -- slot (keel.pending_message_counts). One row per statement: Citus ships an
        -- INSERT ... SELECT with COPY, which row-level security refuses.
        for v_slot in 0 .. 16 loop
            insert into keel.pending_message_counts (tenant_id, slot, pending)
            values (p_tenant_id, v_slot, 0);
        end loop;
    end if;
    select t.* into v_tenant from keel.tenants as t where t.tenant_id = p_tenant_id;
    return v_tenant;
end;
$$;

comment on function keel.create_tenant(uuid, text) is
'Creates the tenant if it does not exist (with the base of its pending-message counter, keel.pending_message_counts), and returns its row. Calling it again with the same id returns the existing row unchanged.';
