-- Tenant tokens (G1): the trusted side hands an agent a token for one tenant, bound to
-- the agent's login when p_login names it (every agent its own login: docs/security.md, Roles).
-- agentkeel:allow citus.require_tenant (it runs on the coordinator, where the signing keys are: keel.adopt_tenant checks the context as require_tenant does; the tenant's liveness would be a remote read as keel_owner, which no node admits, and is checked at every use of the token)
create or replace function keel.mint_tenant_token(
    p_tenant_id uuid,
    p_ttl interval default '15 minutes',
    p_login text default null
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
    v_format text := 'v1';
begin
    -- adopt_tenant, not require_tenant: this runs on the Citus coordinator (the signing
    -- keys are there), where reading the tenant's row is a remote read as keel_owner,
    -- which no node admits. A token for a tenant being deleted is refused at every use.
    perform keel.adopt_tenant(p_tenant_id);
    v_expires := keel.interval_end('token lifetime', p_ttl, clock_timestamp(), interval '1 day');
    if p_login is not null then
        if not exists (
            select 1 from pg_catalog.pg_roles as r
            where r.rolname = p_login and r.rolcanlogin
                and pg_catalog.pg_has_role(r.oid, 'keel_agent', 'member')
        ) then
            raise exception using
                errcode = '22K01',
                message = 'p_login must name a login role that is a member of keel_agent',
                hint = 'Bind a token to the agent login that will use it.';
        end if;
        v_format := 'v2';
    end if;
    select max(k.key_version) into v_version
    from keel.tenant_token_keys as k
    where k.retired_at is null;
    if v_version is null then
        v_version := keel.rotate_tenant_token_key(false);
    end if;
    v_message := format(
        '%s.%s.%s.%s', v_format, v_version, p_tenant_id,
        floor(extract(epoch from v_expires))::bigint
    );
    -- A bound token carries and signs its login's name (hex of its UTF-8 bytes); it
    -- verifies only where that login is session_user, which SET ROLE does not change.
    if p_login is not null then
        v_message := v_message || '.' || encode(convert_to(p_login, 'UTF8'), 'hex');
    end if;
    return v_message || '.' || keel.tenant_token_signature(v_version, v_message);
end;
$$;

comment on function keel.mint_tenant_token(uuid, interval, text) is
'A signed token for the tenant of the current context, valid for p_ttl (default 15 minutes, at most 1 day). With p_login (a login in keel_agent) it verifies only in that login''s sessions; another login using it gets 42K07. Bound tokens look like v2.<key version>.<tenant>.<expiry epoch>.<login, hex of UTF-8>.<hmac-sha256 hex>. It is a credential: an agent session sends it only as a bind parameter, select set_config(''keel.tenant_token'', $1, true), never in query text; it cannot be altered for another tenant.';
