-- Quotas: tenant p_tenant_id's limit p_setting: its own (keel.tenant_quotas), else the one
-- for every tenant (keel.settings), else the shipped default.
create or replace function keel.quota_limit(p_tenant_id uuid, p_setting text)
returns bigint
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_max bigint;
begin
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
            when 'max_tenant_checkpoint_bytes' then 10737418240
            when 'max_tenant_sessions' then 100000
        end
    );
    if v_max is null then
        raise exception using errcode = '22K01', message = format('no quota %s', p_setting);
    end if;
    return v_max;
end;
$$;

comment on function keel.quota_limit(uuid, text) is
'Tenant p_tenant_id''s limit p_setting (max_tenant_pending_messages, max_task_checkpoints, max_task_step_attempts, max_tenant_checkpoint_bytes, max_tenant_sessions): keel.tenant_quotas, else keel.settings, else the shipped default. Shared by keel.check_quota and keel.add_tenant_usage; not granted to any role.';
