-- Worker context proofs (G1, Citus): the tenant a proof was made for, if it verifies now
-- for this login (see keel.context_proof).
create or replace function keel.verify_context_proof(p_proof text)
returns uuid
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_parts text[] := string_to_array(p_proof, '.');
    v_signature text;
begin
    if p_proof is null or p_proof = '' then
        return null;
    end if;
    if array_length(v_parts, 1) is distinct from 5
        or v_parts[1] <> 'c1'
        or v_parts[2] !~ '^[1-9][0-9]{0,8}$'
        or v_parts[3] !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        or v_parts[4] !~ '^[1-9][0-9]{0,11}$'
        or v_parts[5] !~ '^[0-9a-f]{64}$' then
        raise exception using
            errcode = '42K07',
            message = 'worker context proof is malformed',
            hint = 'Bind the context on the coordinator: keel.bind_tenant_context() after setting the token.';
    end if;
    v_signature := keel.context_proof_signature(
        v_parts[2]::integer, array_to_string(v_parts[1:4], '.') || '.' || session_user
    );
    if v_signature is null then
        raise exception using
            errcode = '42K07',
            message = format('worker context proof is signed with unknown or retired key version %s', v_parts[2]),
            hint = 'Run agentkeel distribute so that every node has the current context keys.';
    end if;
    if v_signature <> v_parts[5] then
        raise exception using
            errcode = '42K07',
            message = 'worker context proof does not verify for this login',
            hint = 'A proof is bound to the login that bound it; bind your own token.';
    end if;
    if to_timestamp(v_parts[4]::bigint) <= clock_timestamp() then  -- at call time
        raise exception using
            errcode = '42K07',
            message = 'worker context proof has expired',
            hint = 'Mint a new token.';
    end if;
    return v_parts[3]::uuid;
end;
$$;

comment on function keel.verify_context_proof(text) is
'Returns the tenant of a valid worker context proof for the current login (null for none); raises invalid_tenant_token (42K07) when it is malformed, expired, signed with an unknown or retired context key, altered, or bound to another login. Read by keel.current_tenant() (G1).';
