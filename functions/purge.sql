-- Retention (G11): one bounded step of a tenant's purge, in the caller's transaction. It
-- removes at most p_batch rows of what its retention periods (keel.retention_period) say
-- is finished with: tasks in a terminal state with everything of theirs, idempotency keys
-- of no task past their expires_at (unless still reserved: a task's keys are its run
-- ledger and go with it), checkpoints no worker resumes from, closed sessions, delivered
-- and dead outbox messages, inbox rows. Nothing live: a task that is not terminal, or
-- still has a message (its messages go first, each when its own period is over), is
-- never touched, nor is what it owns.
-- agentkeel:requires functions/retention_period.sql
-- agentkeel:requires functions/purge_rows.sql
-- Safe beside traffic (keel.purge_rows): every row is locked FOR UPDATE SKIP LOCKED, so a
-- row some transaction holds is left for a later step, never waited for; children go
-- before their parents and a parent something still refers to stays, so no delete
-- cascades past the step's budget or into a held row. Events are removed inside the
-- keel.purge guard (G4), the only way they ever are.
-- SECURITY INVOKER, owner only (agentkeel purge runs it as the migrator).
create or replace function keel.purge(
    p_tenant_id uuid,
    p_batch integer default 1000,
    p_dry_run boolean default false
)
returns table (kind text, relation text, removed bigint)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := now();
    v_left integer := p_batch;
    v_kind record;
    v_keep interval;
    v_row record;
begin
    if p_batch is null or p_batch not between 1 and 100000 then
        raise exception using
            errcode = '22K01',
            message = format('a purge step removes 1 to 100000 rows, not %s', coalesce(p_batch::text, 'null'));
    end if;
    perform keel.adopt_tenant(p_tenant_id);
    -- In this order: a finished task waits for its messages to go first.
    for v_kind in
        select *
        from (
            values
            (1, 'expired_operations', 'keel.operations'::regclass, 'operation_id', null::text,
             'x.task_id is null and x.expires_at < $2 and x.state <> ''reserved'''),
            (2, 'old_checkpoints', 'keel.checkpoints'::regclass, 'checkpoint_id', 'retain_old_checkpoints',
             '(x.expires_at < $2 or (x.created_at < $2 - $3 and (x.status <> ''ok'' or exists ('
             'select 1 from keel.checkpoints as n where n.tenant_id = $1'
             ' and n.task_id = x.task_id and n.kind = x.kind and n.status = ''ok'''
             ' and (n.expires_at is null or n.expires_at > $2) and n.seq > x.seq))))'),
            (3, 'closed_sessions', 'keel.sessions'::regclass, 'session_id', 'retain_closed_sessions',
             'x.status <> ''active'' and x.updated_at < $2 - $3'),
            (4, 'delivered_messages', 'keel.outbox'::regclass, 'message_id', 'retain_delivered_messages',
             'x.state = ''delivered'' and x.delivered_at < $2 - $3'),
            (5, 'dead_messages', 'keel.outbox'::regclass, 'message_id', 'retain_dead_messages',
             'x.state = ''dead'' and x.dead_at < $2 - $3'),
            (6, 'inbox', 'keel.inbox'::regclass, 'message_id', 'retain_inbox', 'x.accepted_at < $2 - $3'),
            (7, 'finished_tasks', 'keel.tasks'::regclass, 'task_id', 'retain_finished_tasks',
             'exists (select 1 from keel.workflow_states as s where s.workflow = x.workflow'
             ' and s.workflow_version = x.workflow_version and s.state = x.state and s.terminal)'
             ' and not exists (select 1 from keel.outbox as o where o.tenant_id = $1'
             ' and o.task_id = x.task_id)'
             ' and x.updated_at < $2 - $3')
        ) as k (n, kind, relation, key, setting, condition)
        order by k.n
    loop
        v_keep := case when v_kind.setting is not null then keel.retention_period(p_tenant_id, v_kind.setting) end;
        if p_dry_run then
            kind := v_kind.kind;
            relation := v_kind.relation::text;
            execute format(
                'select count(*) from %s as x where x.tenant_id = $1 and %s',
                v_kind.relation, v_kind.condition
            ) into removed using p_tenant_id, v_now, v_keep;
            return next;
            continue;
        end if;
        exit when v_left <= 0;
        for v_row in
            select r.kind, r.relation, r.removed
            from keel.purge_rows(
                p_tenant_id, v_kind.kind, v_kind.relation, v_kind.key, v_kind.condition,
                v_now, v_keep, v_left
            ) as r
        loop
            v_left := v_left - v_row.removed;
            kind := v_row.kind;
            relation := v_row.relation;
            removed := v_row.removed;
            return next;
        end loop;
    end loop;
end;
$$;

comment on function keel.purge(uuid, integer, boolean) is
'One step of tenant p_tenant_id''s retention purge (G11): removes at most p_batch rows that its retention periods say are finished with (expired_operations of no task, old_checkpoints, closed_sessions, delivered_messages, dead_messages, inbox, finished_tasks with everything of theirs), each with the rows that belong to it, locked FOR UPDATE SKIP LOCKED, never a live row; returns (kind, relation, removed) per table it removed rows from, and credits the bytes of the checkpoint payloads it removed to the tenant (keel.tenant_usage_credits, folded into its max_tenant_checkpoint_bytes counter by its next save). With p_dry_run, removes nothing and returns how many rows of each kind are due now (for finished tasks, the tasks whose messages are gone). Call it until it removes fewer than p_batch (agentkeel purge does). Owner only.';
