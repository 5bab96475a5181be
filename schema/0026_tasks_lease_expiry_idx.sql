-- agentkeel:no-transaction
-- Recovery (G5): the recoverer's scan for expired leases, oldest first. Only leased rows
-- sit in it, a few per worker.
create index concurrently if not exists tasks_lease_expiry_idx
on keel.tasks (lease_expires_at) where lease_owner is not null;
