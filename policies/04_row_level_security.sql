-- Row-level security (G1): enabled and forced on every tenant table, as keel.tenant_tables()
-- finds them in the catalog, so that a new tenant table cannot be forgotten.
do $$
declare
    v_table text;
begin
    for v_table in select t.t::text from keel.tenant_tables() as t (t)
    loop
        execute format('alter table %s enable row level security', v_table);
        execute format('alter table %s force row level security', v_table);
        execute format('drop policy if exists tenant_isolation on %s', v_table);
        execute format(
            'create policy tenant_isolation on %s using (tenant_id = keel.current_tenant())'
            ' with check (tenant_id = keel.current_tenant())',
            v_table
        );
    end loop;
end;
$$;

-- keel.claim_next_task scans every tenant for the oldest due task and locks it (SELECT
-- FOR UPDATE needs both a SELECT and an UPDATE policy). It runs as keel_owner and switches
-- the flag on for that one statement; no other role is named here, and the UPDATE policy
-- admits no new row of its own (with check false): writes still need the tenant context.
drop policy if exists tasks_claim_scan on keel.tasks;
create policy tasks_claim_scan on keel.tasks
for select to keel_owner
using (current_setting('keel.scan_all_tenants', true) = 'on');

drop policy if exists tasks_claim_lock on keel.tasks;
create policy tasks_claim_lock on keel.tasks
for update to keel_owner
using (current_setting('keel.scan_all_tenants', true) = 'on')
with check (false);

-- The retention purge (keel.purge_tenants) pages through every tenant's id, as the owner's
-- own login (SECURITY INVOKER), with the same flag, for one statement.
drop policy if exists tenants_owner_scan on keel.tenants;
create policy tenants_owner_scan on keel.tenants
for select to keel_owner
using (current_setting('keel.scan_all_tenants', true) = 'on');

-- keel.claim_outbox and keel.outbox_status read pending messages of every tenant, the
-- same way and with the same flag as the task claim above: as keel_owner, for one statement.
drop policy if exists outbox_claim_scan on keel.outbox;
create policy outbox_claim_scan on keel.outbox
for select to keel_owner
using (current_setting('keel.scan_all_tenants', true) = 'on');

drop policy if exists outbox_claim_lock on keel.outbox;
create policy outbox_claim_lock on keel.outbox
for update to keel_owner
using (current_setting('keel.scan_all_tenants', true) = 'on')
with check (false);

-- The relay's writes (claim, ack, nack, release): keel_relay has no tenant context, so
-- those functions switch keel.outbox_delivery on around statements that each name one
-- row by its tenant id and message id, fenced by the claim token. Only keel_owner (the
-- functions) is named; no application role can update keel.outbox at all.
drop policy if exists outbox_delivery_read on keel.outbox;
create policy outbox_delivery_read on keel.outbox
for select to keel_owner
using (current_setting('keel.outbox_delivery', true) = 'on');

-- The relay's replay of a dead message checks the tenant's own quota of pending messages
-- (keel.check_quota), with the delivery flag on and no tenant context.
drop policy if exists tenant_quotas_delivery_read on keel.tenant_quotas;
create policy tenant_quotas_delivery_read on keel.tenant_quotas
for select to keel_owner
using (current_setting('keel.outbox_delivery', true) = 'on');

-- The relay's acks, deaths and replays keep the tenant's count of pending messages
-- (keel.count_pending_messages) the same way, with the delivery flag on.
drop policy if exists pending_message_counts_delivery on keel.pending_message_counts;
create policy pending_message_counts_delivery on keel.pending_message_counts
for all to keel_owner
using (current_setting('keel.outbox_delivery', true) = 'on')
with check (current_setting('keel.outbox_delivery', true) = 'on');

drop policy if exists outbox_delivery_write on keel.outbox;
create policy outbox_delivery_write on keel.outbox
for update to keel_owner
using (current_setting('keel.outbox_delivery', true) = 'on')
with check (current_setting('keel.outbox_delivery', true) = 'on');

-- Auditors read the history of every tenant.
drop policy if exists task_events_auditor on keel.task_events;
create policy task_events_auditor on keel.task_events
for select to keel_auditor
using (true);
-- On Citus the cross-tenant scans run as the caller's own login, never as keel_owner (no
-- login may act on a worker as the owner of the tables): the variants of
-- keel.claim_next_tasks and keel.recover_stale_tasks (tools/agentkeel/citus/) read
-- candidates of every tenant as the worker login while the flag is on, then claim each one
-- on its tenant's node. A trusted worker login could read any tenant by setting its
-- context anyway; this only lets it do so in one statement. Select only.
drop policy if exists tasks_worker_scan on keel.tasks;
create policy tasks_worker_scan on keel.tasks
for select to keel_worker
using (current_setting('keel.scan_all_tenants', true) = 'on');
-- keel_relay delivers every tenant's messages; on Citus its claim scans the metadata of
-- every tenant's messages as the relay login (column grants in 03_privileges.sql: never
-- payload or headers), then claims each one on its tenant's node.
drop policy if exists outbox_relay_scan on keel.outbox;
create policy outbox_relay_scan on keel.outbox
for select to keel_relay
using (true);
