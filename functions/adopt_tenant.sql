-- Tenant isolation (G1): the transaction's tenant, checked against the one a call names.
-- keel.require_tenant is this plus the tenant's liveness (G10); this alone is for the paths
-- that must keep working while a tenant is deleted (a claim across tenants, the
-- recoverer, keel.use_tenant on the coordinator): what they touch, the deleter removes.
-- A trusted login (keel.trusted_session: keel_app, keel_worker, keel_owner) that has set
-- no context in this transaction gets the tenant it names: one statement, one round trip.
-- That grants nothing it did not have: such a login may SET LOCAL any tenant itself, so
-- for it the context was never a credential, only a consistency check between two values
-- it chose. The check stays wherever it means something: a transaction that has a
-- context (set by the caller, by an earlier call, or by a claim) refuses any other
-- tenant (42K06), so one transaction still acts for one tenant; an agent still needs its
-- signed token (42K01 without it); table reads without a context still see nothing; and
-- the adopted context is SET LOCAL, so it ends with the transaction.
-- Volatile, because it may set the context (keel.set_tenant_context); a non-volatile
-- PL/pgSQL function could not run SET. Callers invoke it with PERFORM, so it is never
-- inlined or folded. On Citus it runs on the node that holds the tenant, inside the
-- delegated call, where an agent's context is the coordinator's proof of its token.
create or replace function keel.adopt_tenant(p_tenant_id uuid)
returns uuid
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_context uuid := keel.current_tenant();
begin
    if p_tenant_id is null or p_tenant_id = keel.no_tenant() then
        raise exception using errcode = '22K01', message = 'a tenant id (not the nil uuid) is required';
    end if;
    -- The nil uuid as the context: this transaction claimed or recovered tasks of several
    -- tenants (keel.claim_next_tasks, keel.recover_stale_tasks), so it acts for none.
    perform keel.refuse_acting_for_none(
        v_context,
        'Act on each claimed task in a transaction of its own (the client does: one call, one transaction).'
    );
    -- On a Citus worker, inside a transaction block another node began (a delegated call
    -- of a multi-statement transaction), a tenant adopted here would be this node's
    -- alone: the next call, on another node, could adopt another one. So there the
    -- transaction must have set its tenant first (keel.use_tenant, which the coordinator
    -- propagates to every node). One statement in autocommit still adopts.
    if v_context is null and keel.trusted_session() and keel.context_relayed() then
        raise exception using
            errcode = '42K01',
            message = 'no tenant context in this transaction block',
            hint = 'On Citus a transaction block sets its tenant first: select keel.use_tenant($1); the agentkeel client does this per transaction.';
    end if;
    if v_context is null and keel.trusted_session() then
        perform keel.set_tenant_context(p_tenant_id);
        return p_tenant_id;
    end if;
    if v_context is null then
        raise exception using
            errcode = '42K01',
            message = 'no tenant context in this transaction',
            hint = 'This login is not trusted server code: in this transaction, set_config(''keel.tenant_token'', $1, true) with its signed tenant token, then select keel.bind_tenant_context(); the agentkeel client does this per call.';
    end if;
    if v_context <> p_tenant_id then
        raise exception using
            errcode = '42K06',
            message = 'the tenant argument is not the tenant of this transaction',
            hint = 'Pass the tenant id the context was set for.';
    end if;
    return v_context;
end;
$$;

comment on function keel.adopt_tenant(uuid) is
'Raises tenant_context_missing (42K01) when an untrusted login (not keel.trusted_session) has no verified context, tenant_context_mismatch (42K06) when the transaction has a context and p_tenant_id is another tenant; a trusted login without a context gets p_tenant_id as its context. Returns the tenant. keel.require_tenant calls it, then refuses a tenant being deleted; internal.';
