-- Quotas (G9): p_amount more of what a tenant holds in bytes (keel.tenant_usage), refused
-- past its limit. The update takes the tenant's usage row lock and keeps it to commit, so
-- concurrent writers of one tenant add one after another, each to what the last committed:
-- the limit holds exactly under concurrency, in READ COMMITTED as in SERIALIZABLE (where a
-- concurrent add fails with 40001, to be retried). The writers of different tenants never
-- meet. Called in the tenant's context before the writer takes any other row lock (so
-- saves of several tasks in one transaction meet on this row first, not in a cycle), with
-- a negative amount to give back what it then did not write. What purges removed since
-- (keel.tenant_usage_credits) is folded in under the same lock.
-- agentkeel:requires functions/quota_limit.sql
create or replace function keel.add_tenant_usage(
    p_tenant_id uuid,
    p_counter text,
    p_amount bigint
)
returns void
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_setting text;
    v_max bigint;
    v_held bigint;
    v_credit bigint;
    v_now timestamptz := clock_timestamp();
begin
    v_setting := case p_counter when 'checkpoint_bytes' then 'max_tenant_checkpoint_bytes' end;
    if v_setting is null or p_amount is null then
        raise exception using
            errcode = '22K01',
            message = format(
                'no counter %s of %s', coalesce(p_counter, 'null'), coalesce(p_amount::text, 'null')
            );
    end if;
    v_max := keel.quota_limit(p_tenant_id, v_setting);
    update keel.tenant_usage as u
    set amount = u.amount + p_amount, updated_at = v_now
    where u.tenant_id = p_tenant_id and u.counter = p_counter
    returning u.amount into v_held;
    if not found then
        -- The tenant's first save since the counter exists: what it holds, with the
        -- purges' credits not yet folded in added back (the fold below takes them off
        -- again), and p_amount (the caller writes its rows after this call). One
        -- statement, one snapshot: a purge that commits after it has neither its
        -- deletions counted nor its credit added, and its credit is folded later.
        select
            coalesce((
                select sum(octet_length(p.ciphertext))
                from keel.checkpoint_payloads as p
                where p.tenant_id = p_tenant_id
            ), 0)
            + coalesce((
                select sum(c.amount)
                from keel.tenant_usage_credits as c
                where c.tenant_id = p_tenant_id and c.counter = p_counter
            ), 0)
            + p_amount
        into v_held;
        -- A concurrent first save that inserts first is waited for, and this one's amount
        -- added to it.
        insert into keel.tenant_usage as u (tenant_id, counter, amount, updated_at)
        values (p_tenant_id, p_counter, v_held, v_now)
        on conflict on constraint tenant_usage_pkey
        do update set amount = u.amount + p_amount, updated_at = excluded.updated_at
        returning u.amount into v_held;
    end if;
    -- Under the row's lock now: fold in what purges removed since (their credits).
    with folded as (
        delete from keel.tenant_usage_credits as c
        where c.tenant_id = p_tenant_id and c.counter = p_counter
        returning c.amount
    )
    select coalesce(sum(f.amount), 0) into v_credit from folded as f;
    if v_credit > 0 then
        update keel.tenant_usage as u
        set amount = greatest(u.amount - v_credit, 0)
        where u.tenant_id = p_tenant_id and u.counter = p_counter
        returning u.amount into v_held;
    end if;
    if p_amount > 0 and v_held > v_max then
        raise exception using
            errcode = '54K01',
            message = format(
                'checkpoint bytes of tenant %s would be %s with these %s, over the limit of %s',
                p_tenant_id, v_held, p_amount, v_max
            ),
            detail = 'Nothing was written.',
            hint = format(
                'keel.purge gives back what retention removes; settings.%s sets the limit for every tenant, keel.set_tenant_quota one tenant''s.',
                v_setting
            );
    end if;
end;
$$;

comment on function keel.add_tenant_usage(uuid, text, bigint) is
'Adds p_amount (negative: gives back) to tenant p_tenant_id''s counter p_counter (checkpoint_bytes) in keel.tenant_usage under its row lock, folds in the credits of purges (keel.tenant_usage_credits), the first time counts what the tenant holds, and raises quota_exceeded (54K01) when that takes it past its limit (max_tenant_checkpoint_bytes, keel.quota_limit): the caller''s writes roll back with it. No overshoot under concurrent writers of one tenant. Shared by keel.save_checkpoint; not granted to any role.';
