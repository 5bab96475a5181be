-- Tenant tokens (G1): the signature of a token, keys never leave the table.
create or replace function keel.tenant_token_signature(p_key_version integer, p_message text)
returns text
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_key keel.tenant_token_keys;
begin
    select k.* into v_key
    from keel.tenant_token_keys as k
    where k.key_version = p_key_version and k.retired_at is null;
    if not found then
        return null;
    end if;
    return keel.hmac_sha256(v_key.inner_key, v_key.outer_key, p_message);
end;
$$;

comment on function keel.tenant_token_signature(integer, text) is
'HMAC-SHA256 of p_message (hex) under key p_key_version, or null when that key is unknown or retired. Internal: EXECUTE is not granted to any application role.';
