-- The largest batch the batch functions accept (keel.check_batch).
insert into keel.settings (setting, value, description)
values (
    'max_batch_items', '1000',
    'Most items one batch call (keel.transition_tasks, keel.reserve_operations) accepts; a larger batch is refused whole.'
);
