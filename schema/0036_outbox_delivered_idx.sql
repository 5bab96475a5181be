-- agentkeel:no-transaction
-- Outbox delivery (G6): the messages delivered lately, by delivery time
-- (keel.outbox_delivered, `agentkeel relay status`), without reading every delivered row
-- kept until retention. Built without blocking the transitions that write the outbox. A
-- failed concurrent build leaves an INVALID index behind: drop it before running again.
create index concurrently if not exists outbox_delivered_idx on keel.outbox (delivered_at)
where state = 'delivered';
