-- Recovery (G5): how many times the recoverer took a task over from a worker whose lease
-- expired, and how many times it may before the task fails (keel.recover_stale_tasks).
alter table keel.tasks add column recovery_attempts integer not null default 0;

alter table keel.tasks
add constraint tasks_recovery_attempts_check check (recovery_attempts >= 0) not valid;
-- Not validated: every existing row holds the default 0, and new rows are checked.

comment on column keel.tasks.recovery_attempts is
'How many times keel.recover_stale_tasks took the task over after its lease expired unreleased (each with a RECOVERED event). Past settings.max_recovery_attempts the task fails (RECOVERY_EXHAUSTED).';

insert into keel.settings (setting, value, description)
values
(
    'max_recovery_attempts', '5',
    'How many times keel.recover_stale_tasks makes a task whose lease expired due again; the next expiry fails it with a RECOVERY_EXHAUSTED event (G5).'
),
(
    'recovery_failed_state', 'failed',
    'The state a task enters when its recovery attempts are exhausted, if its workflow version declares it; otherwise the task stays in its state, unleased and never due (G5).'
);
