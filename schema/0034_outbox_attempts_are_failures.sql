-- Outbox delivery (G6): an attempt is a failed delivery, not a claim.
-- Counting attempts when a relay claimed a message spent them on crashes between a
-- publish and its ack, so messages the sink had confirmed went dead. From here on:
--   attempts  failed deliveries (keel.nack_outbox), compared with outbox_max_attempts;
--   claims    claims since the last nack or replay (an ack ends them): counted by each
--             claim, given back by a release. A message whose claims keep expiring with no
--             report (a relay that crashes on it) still goes dead, after
--             outbox_max_unreported_claims claims, so it cannot be handed out forever.
-- A message claimed before this migration keeps the attempt its claim counted.
alter table keel.outbox add column claims integer not null default 0;

alter table keel.outbox
add constraint outbox_claims_check check (claims >= 0) not valid;

insert into keel.settings (setting, value, description)
values (
    'outbox_max_unreported_claims', '20',
    'Claims of an outbox message that may end with no ack or nack (the relay crashed, lost its connection, or was killed) before the next claim marks it dead. Releases do not count (G6).'
);

comment on column keel.outbox.attempts is
'Failed deliveries so far: one per keel.nack_outbox. At the topic''s maximum (keel.outbox_topics, else settings.outbox_max_attempts) the message is dead. A claim does not count: a relay that crashed after publishing did not fail the message.';
comment on column keel.outbox.claims is
'Claims since the last nack or replay (a delivered message keeps its count): one per claim, minus releases. A claim that finds settings.outbox_max_unreported_claims of them already marks the message dead instead (a relay that crashes on it).';
comment on column keel.outbox.claimed_by is
'The relay that holds, or last held, the claim; null when the message is not claimed (new, released, nacked or replayed). On a message a claim marked dead (too many unreported claims): the relay whose claim did, which logs it.';
