-- Worker context proofs (G1, Citus): what an agent's verified tenant looks like to a worker.
-- On a Citus cluster an agent's API calls run on the worker that holds its tenant
-- (delegated, over a connection of the agent's own login), and a worker holds no token
-- signing key. So the coordinator, when the agent binds its context
-- (keel.bind_tenant_context, Citus variant), verifies the token here and hands the workers
-- this proof with SET LOCAL: c1.<context key version>.<tenant>.<expiry>.<hmac>, where the
-- HMAC also covers the login (session_user) and the expiry is the token's. A worker
-- accepts it (keel.verify_context_proof) only for that login and until that time: it is
-- worth nothing to any other login, and gives its own login nothing the token did not.
-- Null where no context key exists (PostgreSQL alone, where nothing reads it).
create or replace function keel.context_proof(p_token text)
returns text
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid := keel.verify_tenant_token(p_token);  -- raises 42K07 when invalid
    v_version integer;
    v_message text;
begin
    if v_tenant is null then
        return null;
    end if;
    select max(k.key_version) into v_version
    from keel.context_keys as k
    where k.retired_at is null;
    if v_version is null then
        return null;
    end if;
    v_message := format(
        'c1.%s.%s.%s', v_version, v_tenant, (string_to_array(p_token, '.'))[4]
    );
    return v_message || '.' || keel.context_proof_signature(
        v_version, v_message || '.' || session_user
    );
end;
$$;

comment on function keel.context_proof(text) is
'For a valid tenant token (else invalid_tenant_token, 42K07): a proof of its tenant for the worker nodes of a Citus cluster, bound to the calling login and expiring with the token; null where no context key exists. Set by the Citus variant of keel.bind_tenant_context; verified by keel.verify_context_proof (G1).';
