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
    v_key bytea;
    v_inner bytea;
    v_outer bytea;
begin
    -- 32 random bytes from two version-4 uuids (244 random bits), zero-padded to the
    -- 64-byte SHA-256 block, then xor-ed with the HMAC pads once, here.
    v_key := decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')
        || decode(repeat('00', 32), 'hex');
    v_inner := v_key;
    v_outer := v_key;
    for i in 0..63 loop
        v_inner := set_byte(v_inner, i, get_byte(v_key, i) # 54);
        v_outer := set_byte(v_outer, i, get_byte(v_key, i) # 92);
    end loop;
    lock table keel.tenant_token_keys in exclusive mode;
    select coalesce(max(k.key_version), 0) + 1 into v_version from keel.tenant_token_keys as k;
    if p_retire_previous then
        update keel.tenant_token_keys as k set retired_at = now() where k.retired_at is null;
    end if;
    insert into keel.tenant_token_keys (key_version, inner_key, outer_key)
    values (v_version, v_inner, v_outer);
    return v_version;
end;
$$;

comment on function keel.rotate_tenant_token_key(boolean) is
'Creates the next signing key version, used for new tokens from now on; with p_retire_previous, tokens signed by older keys stop verifying at once. keel_owner only.';
