-- Outbox delivery (G6): what a relay's claim, ack and nack need on keel.outbox, and the
-- limits they read. The claim works like a task lease: available_at doubles as the claim's
-- expiry, so an expired claim is simply due again, and only pending rows sit in the claim
-- index (outbox_pending_idx).

-- Defaults first: a write to a global table before any change to a tenant table (CITUS.md
-- rule 25).
insert into keel.settings (setting, value, description)
values
(
    'outbox_max_attempts', '10',
    'Delivery attempts after which an outbox message is dead, unless keel.outbox_topics sets another limit for its topic (G6).'
),
(
    'outbox_backoff_base', '1 second',
    'Outbox retry backoff: the delay before the second attempt is at most this; each further failure doubles it (G6).'
),
(
    'outbox_backoff_cap', '1 hour',
    'Outbox retry backoff: the longest delay between two attempts (G6).'
);

-- Per-topic limits, read by keel.nack_outbox. A global table: no tenant chooses them.
create table keel.outbox_topics (
    topic text not null,
    max_attempts integer not null,
    description text,
    constraint outbox_topics_pkey primary key (topic),
    constraint outbox_topics_topic_check check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$'),
    constraint outbox_topics_max_attempts_check check (max_attempts between 1 and 1000)
);

comment on table keel.outbox_topics is
'Per-topic delivery limits set by the operator (as keel_owner): a message of a listed topic is dead after max_attempts attempts; other topics use settings.outbox_max_attempts (G6).';

alter table keel.outbox add column claim_token bigint not null default 0;
alter table keel.outbox add column claimed_by text;
alter table keel.outbox add column claimed_at timestamptz;
alter table keel.outbox add column dead_at timestamptz;

alter table keel.outbox
add constraint outbox_claim_token_check check (claim_token >= 0) not valid;
alter table keel.outbox
add constraint outbox_claimed_by_check check (char_length(claimed_by) between 1 and 200) not valid;
alter table keel.outbox
add constraint outbox_dead_at_check check ((state = 'dead') = (dead_at is not null)) not valid;
-- Not validated: every existing row has the defaults (token 0, no claim, none dead), and
-- new rows are checked.

comment on column keel.outbox.state is
'pending (waiting, in backoff, or claimed by a relay), delivered (acked) or dead (max attempts reached, or refused by the sink as permanent).';
comment on column keel.outbox.available_at is
'When the message may next be claimed. While claimed it is the claim''s expiry, so an expired claim makes the message claimable again; after a nack it is the end of the backoff.';
comment on column keel.outbox.attempts is
'Delivery attempts so far, counted when a relay claims the message (so a relay that crashes on it still moves it toward dead); a release gives the attempt back.';
comment on column keel.outbox.claim_token is
'Fencing token: incremented by every claim. ack, nack and release must present the current value (else outbox_claim_lost, 55K08).';
comment on column keel.outbox.claimed_by is
'The relay that holds, or last held, the claim; null when the message is not claimed (new, released, nacked or replayed).';
comment on column keel.outbox.claimed_at is 'When the current or last claim was taken.';
comment on column keel.outbox.dead_at is 'When the message went dead; null unless state is dead.';
comment on column keel.outbox.last_error is
'The last failure a relay reported (keel.nack_outbox), cut to 4000 characters.';

-- The outbox in the shape of Debezium's Outbox Event Router: for teams that read it with
-- their own change-data-capture or poller instead of agentkeel relay.
create view keel.outbox_events with (security_invoker = true) as
select
    o.tenant_id,
    o.payload,
    o.headers,
    o.state,
    o.created_at,
    o.message_id as id,
    o.topic as aggregatetype,
    coalesce(o.message_key, o.task_id::text) as aggregateid,
    coalesce(o.headers ->> 'type', o.topic) as type  -- noqa: RF04
from keel.outbox as o;

comment on view keel.outbox_events is
'keel.outbox as Debezium''s Outbox Event Router expects it: id (the message id, the consumers'' dedupe key), aggregatetype (topic), aggregateid (message key, else task id), type (headers.type, else topic), payload; plus tenant_id, headers, state and created_at. security_invoker: the reader''s own rights and row-level security apply.';
