-- Quotas: the owner sets (or, with null, removes) one tenant's own limit.
create or replace function keel.set_tenant_quota(
    p_tenant_id uuid,
    p_setting text,
    p_value bigint
)
returns keel.tenant_quotas
language plpgsql
volatile
-- SECURITY INVOKER, as keel.destroy_tenant_data_keys: it runs as the owner's own login
-- (on Citus, a definer body on the coordinator would reach the workers as keel_owner,
-- which may not log in there), and no other role may execute it or write the table.
set search_path = pg_catalog, pg_temp
as $$
declare
    v_quota keel.tenant_quotas;
    -- A value, not now() in the upsert: Citus takes only IMMUTABLE functions in its SET.
    v_now timestamptz := now();
    v_most bigint;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_setting is null
        or p_setting not in (
            'max_tenant_pending_messages', 'max_task_checkpoints', 'max_task_step_attempts',
            'max_tenant_checkpoint_bytes', 'max_tenant_sessions'
        ) then
        raise exception using
            errcode = '22K01',
            message = format('no per-tenant quota %s', coalesce(p_setting, 'null')),
            hint = 'One of max_tenant_pending_messages, max_task_checkpoints, max_task_step_attempts, max_tenant_checkpoint_bytes, max_tenant_sessions.';
    end if;
    -- Bytes up to 1 PiB, counts up to 1,000,000,000.
    v_most := case when p_setting like '%\_bytes' then 1125899906842624 else 1000000000 end;
    if p_value is null then
        delete from keel.tenant_quotas as q
        where q.tenant_id = p_tenant_id and q.setting = p_setting
        returning q.* into v_quota;
    elsif p_value not between 0 and v_most then
        raise exception using
            errcode = '22K01',
            message = format('quota %s must be 0 to %s, not %s', p_setting, v_most, p_value);
    else
        insert into keel.tenant_quotas as q (tenant_id, setting, value, updated_at)
        values (p_tenant_id, p_setting, p_value, v_now)
        on conflict on constraint tenant_quotas_pkey
        do update set value = excluded.value, updated_at = excluded.updated_at
        returning q.* into v_quota;
    end if;
    return v_quota;
end;
$$;

comment on function keel.set_tenant_quota(uuid, text, bigint) is
'Sets tenant p_tenant_id''s own limit p_setting (max_tenant_pending_messages, max_task_checkpoints, max_task_step_attempts or max_tenant_sessions, 0 to 1,000,000,000; max_tenant_checkpoint_bytes, 0 to 1 PiB) to p_value, in place of the keel.settings row for that tenant alone; null removes it. Returns the row written, or the one removed (null when there was none). As the owner''s login, in a call of its own or a transaction acting for the tenant. The owner''s alone: not granted to any role, so no application role, agent or worker can raise its own limit.';
