-- Tenant tokens (G1): the tenant a token was minted for, if it verifies now.
create or replace function keel.verify_tenant_token(p_token text)
returns uuid
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_parts text[] := string_to_array(p_token, '.');
    v_count integer := coalesce(array_length(string_to_array(p_token, '.'), 1), 0);
    v_signature text;
begin
    if p_token is null or p_token = '' then
        return null;
    end if;
    -- Expiry and retirement are judged at call time: the clock, and the key table as each
    -- statement sees it. A repeatable-read or serializable snapshot would keep showing a
    -- key retired after the transaction began, so tokens work in READ COMMITTED only.
    if pg_catalog.current_setting('transaction_isolation') <> 'read committed' then
        raise exception using
            errcode = '42K07',
            message = 'tenant tokens are verified in READ COMMITTED transactions only',
            hint = 'A repeatable-read or serializable snapshot would hide a key retired after it was taken: run agent transactions at READ COMMITTED, the default.';
    end if;
    if not ((v_parts[1] = 'v1' and v_count = 5) or (v_parts[1] = 'v2' and v_count = 6))
        or v_parts[2] !~ '^[1-9][0-9]{0,8}$'
        or v_parts[3] !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        or v_parts[4] !~ '^[1-9][0-9]{0,11}$'
        or (v_parts[1] = 'v2' and v_parts[5] !~ '^([0-9a-f]{2}){1,64}$')
        or v_parts[v_count] !~ '^[0-9a-f]{64}$' then
        raise exception using
            errcode = '42K07',
            message = 'tenant token is malformed',
            hint = 'Use the token exactly as keel.mint_tenant_token returned it.';
    end if;
    v_signature := keel.tenant_token_signature(
        v_parts[2]::integer, array_to_string(v_parts[1:v_count - 1], '.')
    );
    if v_signature is null then
        raise exception using
            errcode = '42K07',
            message = format('tenant token is signed with unknown or retired key version %s', v_parts[2]),
            hint = 'Mint a new token.';
    end if;
    if v_signature <> v_parts[v_count] then
        raise exception using
            errcode = '42K07',
            message = 'tenant token signature does not verify',
            hint = 'Tokens cannot be edited: mint a new one for the tenant.';
    end if;
    -- A v2 token is bound to the login it names: the session's login, not current_user.
    if v_parts[1] = 'v2'
        and v_parts[5] <> encode(convert_to(session_user, 'UTF8'), 'hex') then
        raise exception using
            errcode = '42K07',
            message = 'tenant token was minted for another login',
            hint = 'Each agent login uses the tokens minted for it (keel.mint_tenant_token p_login).';
    end if;
    if to_timestamp(v_parts[4]::bigint) <= clock_timestamp() then  -- at call time
        raise exception using
            errcode = '42K07',
            message = 'tenant token has expired',
            hint = 'Mint a new token.';
    end if;
    return v_parts[3]::uuid;
end;
$$;

comment on function keel.verify_tenant_token(text) is
'Returns the tenant of a valid token (null for no token); raises invalid_tenant_token (42K07) when it is malformed, expired, signed with an unknown or retired key, or altered, judged at call time, and in a transaction other than READ COMMITTED, whose snapshot could hide a retirement. Tokens look like v1.<key version>.<tenant>.<expiry epoch>.<hmac-sha256 hex>; v2 tokens, bound to a login, carry its name (hex of UTF-8) before the signature and verify only when that login is session_user.';
