-- Outbox delivery (G6): which tenants have due messages, for the fair share of a claim.
-- agentkeel:allow citus.tenant_filter (the claim's discovery reads every tenant; the Citus claim ranks its candidates instead)
-- A loose scan of outbox_tenant_claimable_idx: one probe for the next tenant with pending
-- messages, one for whether any of them is due; never the messages behind a tenant's first.
-- It starts at a random tenant id and wraps around, so when more tenants are due than a
-- claim serves, no tenant is always first or always last. It visits at most 1,000 tenants,
-- or four times as many as it may return if that is more: the cost of a claim does not grow with the number of tenants
-- whose messages all wait (in backoff, claimed, or of other topics) past that; the claim's
-- oldest-first rounds after the fair share still find every due message.
create or replace function keel.outbox_tenants_due(
    p_now timestamptz,
    p_topic_prefix text,
    p_tenants integer
)
returns uuid[]
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_start uuid := gen_random_uuid();
    v_after uuid := v_start;
    v_wrapped boolean := false;
    v_tenant uuid;
    v_due uuid[] := '{}';
    v_visited integer := 0;
begin
    loop
        select o.tenant_id into v_tenant
        from keel.outbox as o
        where o.state = 'pending' and not o.held and o.tenant_id > v_after
        order by o.tenant_id
        limit 1;
        if v_tenant is null then
            exit when v_wrapped;
            v_wrapped := true;
            v_after := '00000000-0000-0000-0000-000000000000';
            continue;
        end if;
        exit when v_wrapped and v_tenant >= v_start;
        v_visited := v_visited + 1;
        -- "Due" as a row comparison, which only outbox_tenant_claimable_idx serves: a
        -- generic plan of `available_at <= p_now` walked the claim index, oldest first,
        -- past every other tenant's due message to reach this one's (35 ms behind 100,000).
        if exists (
            select 1
            from keel.outbox as o
            where o.tenant_id = v_tenant
                and (o.tenant_id, o.available_at) <= (v_tenant, p_now)
                and o.state = 'pending'
                and not o.held
                and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
        ) then
            v_due := v_due || v_tenant;
            exit when cardinality(v_due) >= p_tenants;
        end if;
        exit when v_visited >= greatest(1000, 4 * p_tenants);
        v_after := v_tenant;
    end loop;
    return v_due;
end;
$$;

comment on function keel.outbox_tenants_due(timestamptz, text, integer) is
'Internal to keel.claim_outbox (run with keel.scan_all_tenants on): up to p_tenants tenants with a pending, unheld message due at p_now (of a topic starting with p_topic_prefix, when given), found by a loose scan of outbox_tenant_claimable_idx from a random tenant id, wrapping around, visiting at most greatest(1000, 4 * p_tenants) tenants with pending messages. The claim gives each of them its share of the batch before any tenant gets more.';
