-- Tenant deletion (G10): crypto-shredding of a tenant's checkpoint payloads.
create or replace function keel.destroy_tenant_data_keys(p_tenant_id uuid)
returns integer
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_count integer;
begin
    perform keel.require_tenant(p_tenant_id);
    update keel.tenant_data_keys as k
    set wrapped_key = null, destroyed_at = v_now
    where k.tenant_id = p_tenant_id and k.destroyed_at is null;
    get diagnostics v_count = row_count;
    return v_count;
end;
$$;

comment on function keel.destroy_tenant_data_keys(uuid) is
'Erases every wrapped data key of the tenant (G10): its checkpoint payloads stay as ciphertext that no one can decrypt, and loading one raises data_key_destroyed (55K10). A later save makes a new key version. Owner only (granted to no application role); returns how many versions were destroyed.';
