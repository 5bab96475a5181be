-- Quotas (G9): a tenant's pending outbox messages, counted as they come and go. Counting
-- them on every transition that writes one cost about 2 µs per pending message (23 ms a
-- transition with 99,000 pending), paid by the tenant's writers exactly while its relay
-- lags. The counter is split in slots: a transaction that adds to a slot holds that row's
-- lock to its commit, so each writer takes a slot no other open transaction holds (its
-- backend's own, 1 + pg_backend_pid() % 16, when free; else any free one; else a new
-- one), and a writer does not wait for another, however long that one keeps its
-- transaction open (keel.create_tenant makes slots 1 to 16 with the tenant; a new slot is
-- numbered at random, and only two writers that make the same one at once meet). Slot 0
-- is the tenant's base: it exists once the slots count every pending message of the
-- tenant (keel.create_tenant makes it; for a tenant made before this migration, its first
-- write that counts makes it), and a recount folds what the slots had wrong into it. The
-- sum of a tenant's slots is what it holds.
create table keel.pending_message_counts (
    tenant_id uuid not null,
    slot integer not null,
    pending bigint not null,
    constraint pending_message_counts_pkey primary key (tenant_id, slot),
    constraint pending_message_counts_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint pending_message_counts_slot_check check (slot between 0 and 1023)
);

comment on table keel.pending_message_counts is
'A tenant''s pending outbox messages, as the sum of its slots: 1 to 1023, where writers add what they write and the relay''s acks and deaths take off what they settle, each in a slot no other open transaction holds (a slot may be negative), and 0, the base, which exists once the slots count every pending message of the tenant and into which keel.recount_pending_messages folds what they had wrong. Kept by keel.count_pending_messages; checked against max_tenant_pending_messages. Written by the functions only; no application role reads or writes it.';
