-- Outbox delivery (G6): per-key ordering without reading the held-back backlog.
-- Before, every claim looked at each due message and asked whether an earlier message of
-- its key was pending: with 10,000 messages queued behind one in-flight message of a key,
-- every claim of every relay read all of them. Now a keyed message written while its key
-- has a pending message is `held`, out of the claim index (migration 0038), until the
-- message before it is delivered or dead (keel.promote_outbox_head). Nobody waits for
-- anybody: the writer decides from what it sees, the relay promotes what it sees, and a
-- held message neither saw (its writer committed after the head was retired) is promoted
-- by the relay's periodic sweep (keel.promote_outbox_heads). The claim still checks each
-- candidate against the earlier pending messages of its key, so `held` decides how soon a
-- message is claimed, never the order.
alter table keel.outbox add column held boolean not null default false;

comment on column keel.outbox.held is
'True for a pending keyed message written while an earlier message of its key was pending: it is left out of the claim index until the message before it is delivered or dead (keel.promote_outbox_head, and the sweep keel.promote_outbox_heads). It decides when a message may be claimed, never the per-key order, which every claim checks.';

-- Adding the column with a constant default rewrites nothing: this file holds its lock for
-- an instant. The pending backlog is held by migration 0038, outside this transaction.
