-- Tenant isolation (G1): the context of a transaction that acts for no tenant.
-- A claim or a recovery that took tasks of several tenants leaves it as the transaction's
-- context, so no later call of the transaction can act for any of them. The nil uuid is
-- never a tenant: keel.require_tenant refuses it as an argument.
create or replace function keel.no_tenant()
returns uuid
language sql
immutable
parallel safe
return '00000000-0000-0000-0000-000000000000'::uuid;

comment on function keel.no_tenant() is
'The tenant context of a transaction that took tasks of several tenants (keel.claim_next_tasks, keel.recover_stale_tasks) and so acts for none of them: the nil uuid, never a tenant id. keel.refuse_acting_for_none and keel.require_tenant refuse calls in such a transaction (tenant_context_mismatch, 42K06).';
