-- agentkeel:no-transaction
-- Outbox delivery (G6): the indexes keel.claim_outbox, keel.dead_outbox and
-- keel.outbox_status read, built without blocking the transitions that write the outbox.
-- A failed concurrent build leaves an INVALID index behind: drop it before running again.

-- Per-key ordering: the earliest pending message of a (tenant, key) is found here, so the
-- claim can pass over the later ones.
create index concurrently if not exists outbox_key_pending_idx on keel.outbox (
    tenant_id, message_key, created_at, position, message_id
) where state = 'pending' and message_key is not null;

-- Dead messages, per tenant in id order (keel.dead_outbox, keel.outbox_status).
create index concurrently if not exists outbox_dead_idx on keel.outbox (tenant_id, message_id) where state = 'dead';
