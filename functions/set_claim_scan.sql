-- Leases with fencing (G5): switch the cross-tenant claim scan on or off.
-- The flag the policies tasks_claim_scan and tasks_claim_lock read (keel_owner only),
-- transaction-local (set_config(..., true): SET LOCAL without parsing a statement, on the
-- claim's hot path). On Citus `agentkeel distribute` replaces this with a variant that
-- runs SET LOCAL one executor level below the client's statement, which Citus propagates
-- to the workers even in autocommit.
create or replace function keel.set_claim_scan(p_on boolean)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pg_catalog.set_config(
        'keel.scan_all_tenants', case when p_on then 'on' else 'off' end, true
    );
end;
$$;

comment on function keel.set_claim_scan(boolean) is
'Sets the transaction-local keel.scan_all_tenants on or off around a cross-tenant scan: the claims (keel.claim_next_tasks, keel.claim_outbox), keel.outbox_status, keel.promote_outbox_heads and the recoverer''s keel.lock_task_to_recover; the one place the flag is set. Internal: the policies it opens name keel_owner only, so only the SECURITY DEFINER functions above (and, on Citus, their SECURITY INVOKER variants through the policies for keel_worker and keel_relay) see other tenants through it. Replaced on Citus by a SET LOCAL variant (agentkeel distribute).';
