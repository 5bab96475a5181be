-- agentkeel:no-transaction
-- Outbox delivery (G6): the claimable messages of each tenant, oldest first. A claim finds
-- the tenants with due messages by a loose scan of this index (one probe per tenant, never
-- the messages behind a tenant's first) and takes each one's share of the batch before any
-- tenant gets more (keel.outbox_tenants_due, keel.claim_outbox): one tenant's flood no
-- longer stands in front of every other tenant's messages. Built without blocking the
-- transitions that write the outbox. A failed concurrent build leaves an INVALID index
-- behind: drop it before running again.
create index concurrently if not exists outbox_tenant_claimable_idx on keel.outbox (
    tenant_id, available_at, created_at, position, message_id
) where state = 'pending' and not held;
