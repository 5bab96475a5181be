-- Durable steps (G8): a step is an operation (G2) whose idempotency key is derived from
-- (task, step_key); this table holds what a step adds: one row per attempt.
create table keel.step_attempts (
    tenant_id uuid not null,
    task_id uuid not null,
    step_key text not null,
    attempt integer not null,
    operation_id uuid not null,
    input_hash text not null,
    status text not null default 'running',
    fencing_token bigint not null,
    retryable boolean not null default false,
    next_retry_at timestamptz,
    repair_count integer not null default 0,
    started_at timestamptz not null default now(),
    finished_at timestamptz,
    constraint step_attempts_pkey primary key (tenant_id, task_id, step_key, attempt),
    constraint step_attempts_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint step_attempts_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint step_attempts_operation_fkey
    foreign key (tenant_id, operation_id)
    references keel.operations (tenant_id, operation_id) on delete cascade,
    constraint step_attempts_step_key_check check (char_length(step_key) between 1 and 200),
    constraint step_attempts_attempt_check check (attempt > 0),
    constraint step_attempts_input_hash_check check (char_length(input_hash) between 1 and 128),
    constraint step_attempts_status_check
    check (status in ('running', 'succeeded', 'failed', 'abandoned')),
    constraint step_attempts_finished_check
    check ((status = 'running') = (finished_at is null)),
    constraint step_attempts_retry_check
    check (next_retry_at is null or (status = 'failed' and retryable)),
    constraint step_attempts_repair_count_check check (repair_count >= 0)
);

create index step_attempts_operation_idx on keel.step_attempts (tenant_id, operation_id);

comment on table keel.step_attempts is
'One row per attempt of a durable step (G8). The step itself is the keel.operations row whose idempotency_key is keel.step_operation_key(task_id, step_key): its input_hash, state, result and error are the step''s, replayed by the G2 rules. A completed step with the same input hash is reused (STEP_RESULT_REUSED event), never attempted again.';
comment on column keel.step_attempts.status is
'running: opened by keel.begin_step; succeeded / failed: closed by keel.complete_step / keel.fail_step; abandoned: its worker lost the lease before closing it, and a later lease holder opened the next attempt.';
comment on column keel.step_attempts.fencing_token is
'The lease token of the worker that opened the attempt.';
comment on column keel.step_attempts.retryable is
'Set by keel.fail_step: the next keel.begin_step with the same input opens another attempt (not before next_retry_at).';
comment on column keel.step_attempts.next_retry_at is
'A failed, retryable attempt: the earliest time keel.begin_step opens the next one.';
comment on column keel.step_attempts.repair_count is
'How many times the worker repaired this attempt''s output (e.g. re-asked a model for valid JSON) before closing it, as reported to keel.complete_step or keel.fail_step.';
