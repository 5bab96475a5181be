-- Quotas (G9): a tenant's checkpoint bytes counted again from its payloads, for the owner
-- who removed rows by hand (a purge writes credits instead: keel.tenant_usage_credits).
-- The counter row is locked first, in its own statement: a save still open holds it and is
-- waited for, so the count (a later statement, a later snapshot in READ COMMITTED) sees it
-- committed; a save that comes after adds to the new count. SECURITY INVOKER, owner only.
create or replace function keel.recount_tenant_usage(p_tenant_id uuid)
returns bigint
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_held bigint;
    v_now timestamptz := clock_timestamp();
    v_counted boolean;
begin
    perform keel.adopt_tenant(p_tenant_id);
    perform 1
    from keel.tenant_usage as u
    where u.tenant_id = p_tenant_id and u.counter = 'checkpoint_bytes'
    for update;
    v_counted := found;
    -- One statement, one snapshot: the credits of the purges this count already reflects
    -- go with it. octet_length reads a stored value's length from its header: no
    -- ciphertext is read.
    with done as (
        delete from keel.tenant_usage_credits as c
        where c.tenant_id = p_tenant_id and c.counter = 'checkpoint_bytes'
        returning 1
    )
    select coalesce(sum(octet_length(p.ciphertext)), 0) into v_held
    from keel.checkpoint_payloads as p
    where p.tenant_id = p_tenant_id;
    if v_counted then
        -- Values, not functions or subqueries in the SET: Citus routes it as it is.
        update keel.tenant_usage as u
        set amount = v_held, updated_at = v_now
        where u.tenant_id = p_tenant_id and u.counter = 'checkpoint_bytes';
    end if;
    return v_held;
end;
$$;

comment on function keel.recount_tenant_usage(uuid) is
'Counts tenant p_tenant_id''s checkpoint bytes again from its checkpoint payloads, under its keel.tenant_usage row''s lock (it waits for a save still open), removes the purge credits that count reflects, and returns the bytes. For the owner after removing checkpoints by hand; a purge needs none. Owner only.';
