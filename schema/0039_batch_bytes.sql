-- The largest batch, in bytes, the batch functions accept (keel.check_batch): with
-- max_batch_items items of up to 64 KiB each, one call could otherwise make the database
-- check and write 64 MiB in one transaction.
insert into keel.settings (setting, value, description)
values (
    'max_batch_bytes', '4194304',
    'Largest batch one batch call (keel.transition_tasks, keel.reserve_operations) accepts, in bytes of its stored form (pg_column_size); a larger batch is refused whole before any item runs.'
);
