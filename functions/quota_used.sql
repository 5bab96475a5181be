-- Quotas: how much of what p_setting limits tenant p_tenant_id (or its task p_task_id)
-- holds. Rows are counted up to p_max (a LIMIT under count), over an index that starts
-- with the tenant (and task), so a count costs at most the limit's index entries; bytes
-- are read from the tenant's counter (keel.tenant_usage). Null for any other setting.
create or replace function keel.quota_used(
    p_tenant_id uuid,
    p_task_id uuid,
    p_setting text,
    p_max bigint
)
returns bigint
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_used bigint;
begin
    if p_setting = 'max_tenant_pending_messages' then
        select t.pending into v_used from keel.pending_message_tally(p_tenant_id, p_max) as t;
    elsif p_setting = 'max_task_checkpoints' then
        select count(*) into v_used
        from (
            select 1
            from keel.checkpoints as c
            where c.tenant_id = p_tenant_id and c.task_id = p_task_id
            limit p_max
        ) as u;
    elsif p_setting = 'max_task_step_attempts' then
        select count(*) into v_used
        from (
            select 1
            from keel.step_attempts as a
            where a.tenant_id = p_tenant_id and a.task_id = p_task_id
            limit p_max
        ) as u;
    elsif p_setting = 'max_tenant_sessions' then
        select count(*) into v_used
        from (
            select 1
            from keel.sessions as s
            where s.tenant_id = p_tenant_id
            limit p_max
        ) as u;
    elsif p_setting = 'max_tenant_checkpoint_bytes' then
        select u.amount into v_used
        from keel.tenant_usage as u
        where u.tenant_id = p_tenant_id and u.counter = 'checkpoint_bytes';
        if v_used is not null then
            -- Less what purges removed and the next save has not folded in yet.
            select greatest(v_used - coalesce(sum(c.amount), 0), 0) into v_used
            from keel.tenant_usage_credits as c
            where c.tenant_id = p_tenant_id and c.counter = 'checkpoint_bytes';
        else
            -- No save since the counter exists: what the tenant holds.
            select coalesce(sum(octet_length(p.ciphertext)), 0) into v_used
            from keel.checkpoint_payloads as p
            where p.tenant_id = p_tenant_id;
        end if;
    end if;
    return v_used;
end;
$$;

comment on function keel.quota_used(uuid, uuid, text, bigint) is
'How much of what p_setting limits tenant p_tenant_id holds: pending outbox messages (max_tenant_pending_messages), sessions (max_tenant_sessions), checkpoints or step attempts of task p_task_id (max_task_checkpoints, max_task_step_attempts), each counted up to p_max; checkpoint bytes (max_tenant_checkpoint_bytes) from keel.tenant_usage less the purges'' credits not yet folded in. Null for any other setting. Shared by keel.check_quota and keel.tenant_quota_status; not granted to any role.';
