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
    v_expires timestamptz;
begin
    perform keel.require_tenant(p_tenant_id);
    v_expires := keel.interval_end('token lifetime', p_ttl, clock_timestamp(), interval '1 day');
    select max(k.key_version) into v_version
    from keel.tenant_token_keys as k
    where k.retired_at is null;
    if v_version is null then
        v_version := keel.rotate_tenant_token_key(false);
    end if;
    v_message := format(
        'v1.%s.%s.%s', v_version, p_tenant_id,
        floor(extract(epoch from v_expires))::bigint
    );
    return v_message || '.' || keel.tenant_token_signature(v_version, v_message);
end;
$$;

comment on function keel.mint_tenant_token(uuid, interval) is
'A signed token for the tenant of the current context, valid for p_ttl (default 15 minutes, at most 1 day). It is a credential: an agent session sends it only as a bind parameter, select set_config(''keel.tenant_token'', $1, true), never in query text; it cannot be altered for another tenant.';
