-- agentkeel:no-transaction
-- Outbox delivery (G6): the messages a relay's claims marked dead (claimed over and over
-- with no ack or nack), by relay, in the order the relay logs them. Built without blocking
-- the transitions that write the outbox. A failed concurrent build leaves an INVALID index
-- behind: drop it before running again.
create index concurrently if not exists outbox_claim_deaths_idx on keel.outbox (
    claimed_by, dead_at, message_id
) where state = 'dead' and claimed_by is not null;
