-- Quotas: every limit of one tenant, where it comes from, and how much of it the tenant
-- holds (agentkeel tenant quota). SECURITY INVOKER, owner only: as keel.set_tenant_quota.
-- agentkeel:requires functions/quota_limit.sql
-- agentkeel:requires functions/quota_used.sql
create or replace function keel.tenant_quota_status(p_tenant_id uuid)
returns table (setting text, per text, quota bigint, own boolean, used bigint)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id;
    if not found then
        raise exception using errcode = '42K02', message = format('unknown tenant %s', p_tenant_id);
    end if;
    -- A loop of assignments, not one query calling the lookups per row: on Citus a query
    -- that runs on the tenant's shard may not start the lookups' queries from inside it.
    foreach setting in array array[
        'max_tenant_pending_messages', 'max_tenant_sessions', 'max_tenant_checkpoint_bytes',
        'max_task_checkpoints', 'max_task_step_attempts'
    ]
    loop
        per := case when setting like 'max\_task\_%' then 'task' else 'tenant' end;
        quota := keel.quota_limit(p_tenant_id, setting);
        own := exists (
            select 1
            from keel.tenant_quotas as q
            where q.tenant_id = p_tenant_id and q.setting = tenant_quota_status.setting
        );
        used := case when per = 'tenant' then keel.quota_used(p_tenant_id, null, setting, quota) end;
        return next;
    end loop;
end;
$$;

comment on function keel.tenant_quota_status(uuid) is
'Every quota of tenant p_tenant_id: setting, per (tenant, or task for the limits of each task), quota (keel.quota_limit), own (set for this tenant by keel.set_tenant_quota) and used (what the tenant holds, counted up to the limit; null for per-task limits). unknown_tenant (42K02) for a tenant that does not exist. Owner only, in a call of its own or a transaction acting for the tenant (agentkeel tenant quota).';
