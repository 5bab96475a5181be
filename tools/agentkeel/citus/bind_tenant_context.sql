-- Tenant isolation (G1), on Citus: bind the tenant context set in this transaction to it.
-- Installed by `agentkeel distribute` in place of functions/bind_tenant_context.sql, whose
-- set_config Citus never propagates.
-- agentkeel:requires functions/context_stamp.sql
-- agentkeel:allow citus.set_local_autocommit (in autocommit the stamp ends with the statement, and with it every context: later calls fail with tenant_context_missing, never run in another tenant)
-- Called right after the context is set, in the same transaction: SET LOCAL keel.tenant_id
-- (trusted roles), or the agent's token as a bound, transaction-local setting. It sets the
-- stamp with SET LOCAL so that Citus propagates it like the tenant id itself. For an
-- untrusted login with a token it also sets keel.context_proof: the agent's API calls run
-- on the worker that holds its tenant, which has no token signing key and honours this
-- proof instead (keel.context_proof: made here, on the coordinator, after verifying the
-- token; bound to the login). Without a token here (a trusted login, or this very
-- function run on a worker by a delegated call, where only the proof arrived) the proof is
-- left as it is: a SET LOCAL of this transaction, or nothing.
create or replace function keel.bind_tenant_context()
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_token text := pg_catalog.current_setting('keel.tenant_token', true);
begin
    execute format('set local keel.context_stamp = %L', keel.context_stamp());
    if coalesce(v_token, '') <> '' and not keel.trusted_session() then
        execute format(
            'set local keel.context_proof = %L', coalesce(keel.context_proof(v_token), '')
        );
    end if;
end;
$$;

comment on function keel.bind_tenant_context() is
'Citus variant (installed by agentkeel distribute): marks the tenant context of the current transaction as set in it (SET LOCAL keel.context_stamp = keel.context_stamp()), and for an untrusted login with a tenant token sets the worker context proof (SET LOCAL keel.context_proof = keel.context_proof(token)), which the workers verify. Without it keel.current_tenant() is null: a context left by an earlier transaction or another pooled client is never honoured (G1).';
