-- Tenant tokens (G1): the trusted side hands an agent a token for one tenant.
create or replace function keel.mint_tenant_token(
    p_tenant_id uuid,
    p_ttl interval default '15 minutes'
)
returns text
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_version integer;
    v_message text;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_ttl is null or p_ttl <= interval '0' or p_ttl > interval '1 day' then
        raise exception using
            errcode = '22K01',
            message = 'token lifetime must be positive and at most 1 day';
    end if;
    select max(k.key_version) into v_version
    from keel.tenant_token_keys as k
    where k.retired_at is null;
    if v_version is null then
        v_version := keel.rotate_tenant_token_key(false);
    end if;
    v_message := format(
        'v1.%s.%s.%s', v_version, p_tenant_id,
        floor(extract(epoch from clock_timestamp() + p_ttl))::bigint
    );
    return v_message || '.' || keel.tenant_token_signature(v_version, v_message);
end;
$$;

comment on function keel.mint_tenant_token(uuid, interval) is
'A signed token for the tenant of the current context, valid for p_ttl (default 15 minutes, at most 1 day). An agent session sets it with SET LOCAL keel.tenant_token; it cannot be altered for another tenant.';
