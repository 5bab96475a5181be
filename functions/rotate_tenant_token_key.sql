-- Tenant tokens (G1): add a signing key version, optionally retiring the older ones.
create or replace function keel.rotate_tenant_token_key(p_retire_previous boolean default false)
returns integer
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_version integer;
    v_key record;
begin
    select * into v_key from keel.hmac_key_pads();
    lock table keel.tenant_token_keys in exclusive mode;
    select coalesce(max(k.key_version), 0) + 1 into v_version from keel.tenant_token_keys as k;
    if p_retire_previous then
        update keel.tenant_token_keys as k set retired_at = now() where k.retired_at is null;
    end if;
    insert into keel.tenant_token_keys (key_version, inner_key, outer_key)
    values (v_version, v_key.inner_key, v_key.outer_key);
    return v_version;
end;
$$;

comment on function keel.rotate_tenant_token_key(boolean) is
'Creates the next signing key version, used for new tokens from now on; with p_retire_previous, tokens signed by older keys stop verifying at once. keel_owner only.';
