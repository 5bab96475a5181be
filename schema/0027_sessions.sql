-- Sessions (chat-loop agents): one snapshot row per session plus its step updates, with
-- completed / failed protected from being overwritten (G3, G9).
create table keel.sessions (
    tenant_id uuid not null,
    session_id text not null,
    task_id uuid,
    state jsonb not null default '{}',
    status text not null default 'active',
    state_version bigint not null default 1,
    last_update_seq bigint not null default 0,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    constraint sessions_pkey primary key (tenant_id, session_id),
    constraint sessions_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint sessions_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint sessions_session_id_check check (char_length(session_id) between 1 and 200),
    constraint sessions_state_check check (jsonb_typeof(state) = 'object'),
    constraint sessions_status_check check (status in ('active', 'completed', 'failed')),
    constraint sessions_state_version_check check (state_version > 0),
    constraint sessions_last_update_seq_check check (last_update_seq >= 0)
);

create index sessions_task_idx on keel.sessions (tenant_id, task_id) where task_id is not null;

comment on table keel.sessions is
'One snapshot per chat-loop session: the agent''s state object and the session status, saved idempotently by keel.save_session. Step updates go to keel.session_updates; keel.load_session merges them.';
comment on column keel.sessions.status is
'active, or terminal: completed / failed. A terminal status is never replaced by active (keel.save_session raises session_update_refused).';
comment on column keel.sessions.state_version is
'Incremented by every save that changes the snapshot; a save may name the version it expects.';
comment on column keel.sessions.last_update_seq is
'The seq of the newest row in keel.session_updates for this session: the per-session counter that orders updates, taken under this row''s lock.';

create table keel.session_updates (
    tenant_id uuid not null,
    session_id text not null,
    seq bigint not null,
    step_key text not null,
    status text not null,
    attempt integer not null,
    result jsonb,
    error jsonb,
    actor text not null,
    claimed_actor text,
    created_at timestamptz not null default now(),
    constraint session_updates_pkey primary key (tenant_id, session_id, seq),
    constraint session_updates_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint session_updates_session_fkey
    foreign key (tenant_id, session_id)
    references keel.sessions (tenant_id, session_id) on delete cascade,
    constraint session_updates_seq_check check (seq > 0),
    constraint session_updates_step_key_check check (char_length(step_key) between 1 and 200),
    constraint session_updates_status_check
    check (status in ('running', 'completed', 'failed')),
    constraint session_updates_outcome_check check (
        case status
            when 'failed' then result is null
            else error is null
        end
    ),
    constraint session_updates_attempt_check check (attempt > 0),
    constraint session_updates_actor_check check (char_length(actor) between 1 and 200),
    constraint session_updates_claimed_actor_check
    check (char_length(claimed_actor) between 1 and 200)
);

-- The latest update of one step: what keel.record_session_update compares with.
create index session_updates_step_idx
on keel.session_updates (tenant_id, session_id, step_key, seq);

comment on table keel.session_updates is
'Step updates of a session, in per-session seq order: only updates keel.record_session_update applied are stored, so the latest row of a step is its merged value.';
comment on column keel.session_updates.status is
'running, or terminal for the step: completed / failed.';
comment on column keel.session_updates.attempt is
'The caller''s attempt number for the step. A terminal update replaces an earlier terminal one only with a higher attempt.';
comment on column keel.session_updates.actor is
'The login (session_user) that wrote the update; claimed_actor is the caller''s label.';

insert into keel.settings (setting, value, description)
values
(
    'max_session_state_bytes', '262144',
    'Largest session state object (keel.save_session), in bytes of its JSON text (G9).'
),
(
    'max_session_update_bytes', '65536',
    'Largest step update result or error (keel.record_session_update), in bytes of its JSON text (G9).'
);
