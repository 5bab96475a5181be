-- Quotas: whether p_adding more rows of a kind would take a tenant or a task past its
-- limit (keel.tenant_quotas, else keel.settings). The count stops at the limit (a LIMIT
-- under count), over an index that starts with the tenant (and task), so it costs at most
-- the limit's index entries.
create or replace function keel.check_quota(
    p_tenant_id uuid,
    p_task_id uuid,
    p_setting text,
    p_adding integer
)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max bigint;
    v_used bigint;
    v_what text;
begin
    -- The tenant's own limit, else the one for every tenant, else the shipped default.
    select q.value into v_max
    from keel.tenant_quotas as q
    where q.tenant_id = p_tenant_id and q.setting = p_setting;
    if v_max is null then
        select s.value::bigint into v_max from keel.settings as s where s.setting = p_setting;
    end if;
    v_max := coalesce(
        v_max,
        case p_setting
            when 'max_tenant_pending_messages' then 100000
            when 'max_task_checkpoints' then 10000
            when 'max_task_step_attempts' then 10000
        end
    );
    if p_setting = 'max_tenant_pending_messages' then
        v_what := format('pending outbox messages of tenant %s', p_tenant_id);
        -- Two partial indexes, the claimable messages and the held ones, hold them all.
        select count(*) into v_used
        from (
            select 1
            from keel.outbox as o
            where o.tenant_id = p_tenant_id and o.state = 'pending' and not o.held
            union all
            select 1
            from keel.outbox as o
            where o.tenant_id = p_tenant_id and o.state = 'pending' and o.held
            limit v_max
        ) as u;
    elsif p_setting = 'max_task_checkpoints' then
        v_what := format('checkpoints of task %s', p_task_id);
        select count(*) into v_used
        from (
            select 1
            from keel.checkpoints as c
            where c.tenant_id = p_tenant_id and c.task_id = p_task_id
            limit v_max
        ) as u;
    elsif p_setting = 'max_task_step_attempts' then
        v_what := format('step attempts of task %s', p_task_id);
        select count(*) into v_used
        from (
            select 1
            from keel.step_attempts as a
            where a.tenant_id = p_tenant_id and a.task_id = p_task_id
            limit v_max
        ) as u;
    else
        raise exception using errcode = '22K01', message = format('no quota %s', p_setting);
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
'Raises quota_exceeded (54K01) when p_adding more would take the count named by p_setting past its limit (the tenant''s own in keel.tenant_quotas, else the one in keel.settings): max_tenant_pending_messages (pending outbox messages of tenant p_tenant_id, default 100,000), max_task_checkpoints (checkpoints of task p_task_id, default 10,000), max_task_step_attempts (step attempts of task p_task_id, default 10,000). The count stops at the limit. Shared by keel.write_outbox, keel.save_checkpoint and keel.begin_step; not granted to any role.';
