-- agentkeel:no-transaction
-- Outbox delivery (G6): the claim index holds the claimable messages only (pending, not
-- held behind an earlier message of their key), so a claim reads no held-back backlog;
-- the held ones by key, for the sweep that promotes a key's head (keel.promote_outbox_heads).
-- Built without blocking the transitions that write the outbox; the index they replace goes
-- after them. A failed concurrent build leaves an INVALID index behind: drop it before
-- running again.
create index concurrently if not exists outbox_claimable_idx on keel.outbox (available_at)
where state = 'pending' and not held;

create index concurrently if not exists outbox_held_idx on keel.outbox (tenant_id, message_key)
where state = 'pending' and held;

drop index concurrently if exists keel.outbox_pending_idx;
