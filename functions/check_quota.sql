-- Quotas: whether p_adding more rows of a kind would take a tenant or a task past its
-- limit (keel.quota_limit), counted by keel.quota_used; pending outbox messages are read
-- from their counter, which this check also adds the p_adding to (the caller writes them
-- next; a refusal rolls the addition back with the rest).
-- agentkeel:requires functions/quota_limit.sql
-- agentkeel:requires functions/quota_used.sql
-- agentkeel:requires functions/count_pending_messages.sql
create or replace function keel.check_quota(
    p_tenant_id uuid,
    p_task_id uuid,
    p_setting text,
    p_adding integer
)
returns void
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_max bigint;
    v_used bigint;
    v_what text;
begin
    v_max := keel.quota_limit(p_tenant_id, p_setting);
    if p_setting = 'max_tenant_pending_messages' then
        v_used := keel.count_pending_messages(p_tenant_id, p_adding, v_max);
    else
        v_used := keel.quota_used(p_tenant_id, p_task_id, p_setting, v_max);
    end if;
    v_what := case p_setting
        when 'max_tenant_pending_messages' then format('pending outbox messages of tenant %s', p_tenant_id)
        when 'max_task_checkpoints' then format('checkpoints of task %s', p_task_id)
        when 'max_task_step_attempts' then format('step attempts of task %s', p_task_id)
        when 'max_tenant_sessions' then format('sessions of tenant %s', p_tenant_id)
    end;
    if v_what is null then
        raise exception using errcode = '22K01', message = format('no counted quota %s', p_setting);
    end if;
    if v_used + p_adding > v_max then
        raise exception using
            errcode = '54K01',
            message = format(
                '%s would be %s with these %s, over the limit of %s',
                v_what, v_used + p_adding, p_adding, v_max
            ),
            detail = 'Nothing was written.',
            hint = format(
                'settings.%s sets the limit for every tenant, keel.set_tenant_quota one tenant''s.',
                p_setting
            );
    end if;
end;
$$;

comment on function keel.check_quota(uuid, uuid, text, integer) is
'Raises quota_exceeded (54K01) when p_adding more would take the count named by p_setting past its limit (the tenant''s own in keel.tenant_quotas, else the one in keel.settings): max_tenant_pending_messages (pending outbox messages of tenant p_tenant_id, default 100,000), max_task_checkpoints (checkpoints of task p_task_id, default 10,000), max_task_step_attempts (step attempts of task p_task_id, default 10,000), max_tenant_sessions (sessions of tenant p_tenant_id, active or closed, default 100,000). The count stops at the limit. Pending messages are read from the tenant''s counter (keel.count_pending_messages), to which the check adds p_adding: the caller writes them next, and a refusal rolls the addition back. Shared by keel.write_outbox, keel.save_checkpoint, keel.begin_step and keel.save_session; not granted to any role.';
