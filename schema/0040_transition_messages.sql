-- The most outbox messages one transition may write (keel.transition_task): without it one
-- call could queue any number of messages in one transaction.
insert into keel.settings (setting, value, description)
values (
    'max_transition_messages', '1000',
    'Most outbox messages one transition (keel.transition_task, and each item of keel.transition_tasks) may write; more are refused whole (G9).'
);
