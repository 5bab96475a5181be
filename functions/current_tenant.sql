-- Tenant isolation (G1): the tenant of the current transaction, as the RLS policies see it.
create or replace function keel.current_tenant()
returns uuid
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_value text;
begin
    -- Trusted server code (keel_app, keel_worker, keel_owner) sets the plain context.
    -- Every other session, keel_agent above all, must present a signed token: setting
    -- keel.tenant_id by hand selects nothing. session_user, not current_user, decides,
    -- so SET ROLE cannot promote an untrusted login and SECURITY DEFINER functions see
    -- the caller's context.
    if pg_has_role(session_user, 'keel_app', 'member')
        or pg_has_role(session_user, 'keel_worker', 'member')
        or pg_has_role(session_user, 'keel_owner', 'member') then
        v_value := current_setting('keel.tenant_id', true);
        if v_value is null or v_value = '' then
            return null;
        end if;
        if v_value !~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$' then
            raise exception using
                errcode = '42K01',
                message = 'the tenant context keel.tenant_id is not a uuid',
                hint = 'SET LOCAL keel.tenant_id = ''<tenant uuid>'' inside the transaction.';
        end if;
        return v_value::uuid;
    end if;
    v_value := current_setting('keel.tenant_token', true);
    if v_value is null or v_value = '' then
        return null;
    end if;
    return keel.verify_tenant_token(v_value);
end;
$$;

comment on function keel.current_tenant() is
'The tenant of this transaction, or null when none is set (RLS then shows nothing). Trusted sessions (members of keel_app, keel_worker, keel_owner) use SET LOCAL keel.tenant_id; all others need SET LOCAL keel.tenant_token to a token from keel.mint_tenant_token, verified on use (G1).';
