-- Leases with fencing (G5), on Citus: switch the cross-tenant claim scan on or off.
-- Installed by `agentkeel distribute` in place of functions/set_claim_scan.sql, whose
-- set_config Citus never propagates.
-- The flag the policies tasks_claim_scan and tasks_claim_lock read (keel_owner only).
-- Set here, inside a query of the claim function (PERFORM), one executor level below the
-- client's statement: Citus propagates a SET LOCAL made there to the worker connections
-- even in autocommit, where one made by the client's own statement is not propagated and
-- the scan would silently find nothing on the workers.
create or replace function keel.set_claim_scan(p_on boolean)
returns void
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_on then
        execute 'set local keel.scan_all_tenants = on';
    else
        execute 'set local keel.scan_all_tenants = off';
    end if;
end;
$$;

comment on function keel.set_claim_scan(boolean) is
'Citus variant (installed by agentkeel distribute): sets SET LOCAL keel.scan_all_tenants on or off around a cross-tenant scan (the claims, outbox_status, the sweep, the recoverer), one executor level below the client''s statement so that Citus propagates it to the workers. Internal: granted to keel_worker and keel_relay for the SECURITY INVOKER variants that scan as those logins; the policies the flag opens name keel_owner and, for reading task and message metadata, keel_worker and keel_relay.';
