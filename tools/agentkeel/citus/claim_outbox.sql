-- Outbox delivery (G6), on Citus: claim pending outbox messages of any tenant, oldest first.
-- agentkeel:allow citus.tenant_filter (the candidate scan reads every tenant, without a lock)
-- Installed by `agentkeel distribute` in place of functions/claim_outbox.sql, whose single
-- FOR UPDATE SKIP LOCKED over every tenant is a multi-shard row lock, which Citus refuses,
-- and which, as a SECURITY DEFINER function on the coordinator, would reach the workers as
-- its owner (keel_owner may not log in on a cluster). Callers do not change.
-- SECURITY INVOKER: everything it does on the workers runs as the relay's own login.
--   1. The fair share, half the batch: which tenants have due messages (a
--      multi-shard SELECT DISTINCT, which each shard answers from its part of
--      outbox_tenant_claimable_idx), then each one's oldest share of the batch (a query on
--      its own shard). Then an unlocked candidate scan over every tenant, oldest
--      available_at first, a batch at a time, for the rest: a multi-shard SELECT of
--      message metadata (keel_relay may read those columns of every tenant, never
--      payloads: policy outbox_relay_scan, column grants).
--   2. For each tenant's candidates, one call of keel.claim_due_messages on the node that
--      holds the tenant, which locks them with SKIP LOCKED, rechecks that each is still
--      pending, due and the oldest pending message of its key, and claims them in one
--      statement.
create or replace function keel.claim_outbox(
    p_relay text,
    p_limit integer default 100,
    p_lease interval default '30 seconds',
    p_topic_prefix text default null
)
returns setof keel.outbox
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- The scan's shard queries go over one connection per worker, the one Citus keeps open
-- between statements: a pool of new connections per call (the default, up to 16 per
-- worker, each with its TLS handshake) cost more than the scan.
set "citus.max_adaptive_executor_pool_size" = 1
-- As in the PostgreSQL function: no JIT compilation of a scan that reads a few entries.
set jit = off
as $$
declare
    v_round integer := greatest(64, p_limit);
    v_now timestamptz := clock_timestamp();
    v_tenants uuid[];
    v_ids uuid[];
    v_keys text[];
    v_availables timestamptz[];
    -- The keys (tenant/key) of the messages this call has claimed: at most one a key, as on
    -- PostgreSQL.
    v_claimed_keys text[] := '{}';
    -- Candidates in available_at order only, the pending index's order (the messages of
    -- one transaction share one available_at): rounds as in the Citus keel.claim_next_tasks,
    -- the rest of a full round's last tie group (v_tie, minus what was tried) next.
    v_after timestamptz := '-infinity';
    v_tie timestamptz;
    v_tried text[] := '{}';
    v_count integer;
    v_message keel.outbox;
    v_claimed integer := 0;
    v_due uuid[];
    v_share integer;
    v_from integer;
    v_to integer;
    v_tenant uuid;
    v_chunk uuid[];
begin
    perform keel.check_lease_request(p_relay, p_lease, v_now);
    perform keel.check_claim_limit(p_limit);
    -- The fair share. The tenants come from a distinct scan of each shard's claimable
    -- messages (it reads each due message's index entry once: what a flood costs here,
    -- against a loose scan on PostgreSQL); their candidates from one query per tenant.
    -- In random order: when more tenants are due than the batch has slots (or the batch is
    -- one message), no tenant is always the one served.
    select array_agg(d.tenant_id order by random()) into v_due
    from (
        select distinct o.tenant_id
        from keel.outbox as o
        where o.state = 'pending'
            and not o.held
            and o.available_at <= v_now
            and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
    ) as d;
    -- Half the batch (rounded down) is shared; the rest goes oldest first, as on PostgreSQL.
    v_due := v_due[1:p_limit / 2];
    if cardinality(v_due) >= 1 then
        v_share := ceil((p_limit / 2)::numeric / cardinality(v_due));
        for i in 1 .. cardinality(v_due) loop
            select array_agg(c.message_id order by c.available_at, c.created_at, c.position)
            into v_ids
            from (
                select o.message_id, o.available_at, o.created_at, o.position
                from keel.outbox as o
                where o.tenant_id = v_due[i]
                    and o.state = 'pending'
                    and not o.held
                    and o.available_at <= v_now
                    and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
                order by o.available_at, o.created_at, o.position, o.message_id
                limit v_share
            ) as c;
            -- The shares, rounded up, may add up to a few more than the batch.
            v_ids := v_ids[1:p_limit - v_claimed];
            continue when coalesce(cardinality(v_ids), 0) = 0;
            -- One call on the tenant's node claims what is still claimable of its share
            -- (at most one message of a key: the call checks each against the others).
            for v_message in
                select c.*
                from keel.claim_due_messages(v_due[i], v_ids, p_relay, p_lease, p_topic_prefix) as c
            loop
                return next v_message;
                v_claimed := v_claimed + 1;
                if v_message.message_key is not null then
                    v_claimed_keys := v_claimed_keys || (v_due[i]::text || '/' || v_message.message_key);
                end if;
            end loop;
            exit when v_claimed >= p_limit;
        end loop;
        if v_claimed >= p_limit then
            return;
        end if;
    end if;
    loop
        select
            array_agg(c.tenant_id order by c.available_at),
            array_agg(c.message_id order by c.available_at),
            array_agg(c.message_key order by c.available_at),
            array_agg(c.available_at order by c.available_at)
        into v_tenants, v_ids, v_keys, v_availables
        from (
            select o.tenant_id, o.message_id, o.message_key, o.available_at
            from keel.outbox as o
            where o.state = 'pending'
                and o.available_at <= v_now
                and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
                and not o.held
                and (
                    o.message_key is null
                    or not exists (
                        select 1
                        from keel.outbox as e
                        where e.tenant_id = o.tenant_id
                            and e.message_key = o.message_key
                            and e.state = 'pending'
                            and (e.created_at, e.position, e.message_id)
                            < (o.created_at, o.position, o.message_id)
                    )
                )
                and (
                    (v_tie is null and o.available_at > v_after)
                    or (
                        o.available_at = v_tie
                        and o.tenant_id::text || '/' || o.message_id::text <> all(v_tried)
                    )
                )
            order by o.available_at
            limit case when v_tie is null then v_round end
        ) as c;
        v_count := coalesce(array_length(v_tenants, 1), 0);
        -- The candidates in chunks of what the batch still has room for, oldest first;
        -- each chunk is one call of keel.claim_due_messages per tenant, on its node.
        v_from := 1;
        while v_from <= v_count and v_claimed < p_limit loop
            v_to := least(v_count, v_from + (p_limit - v_claimed) - 1);
            for v_tenant, v_chunk in
                select c.tenant_id, array_agg(c.message_id order by c.n)
                from unnest(v_tenants[v_from:v_to], v_ids[v_from:v_to], v_keys[v_from:v_to])
                    with ordinality as c (tenant_id, message_id, message_key, n)
                -- A key this call holds a message of: its writer committed after that
                -- message's; left for a later claim.
                where c.message_key is null
                    or not (c.tenant_id::text || '/' || c.message_key = any(v_claimed_keys))
                group by c.tenant_id
                order by min(c.n)
            loop
                for v_message in
                    select c.*
                    from keel.claim_due_messages(v_tenant, v_chunk, p_relay, p_lease, p_topic_prefix) as c
                loop
                    return next v_message;
                    v_claimed := v_claimed + 1;
                    if v_message.message_key is not null then
                        v_claimed_keys := v_claimed_keys || (v_tenant::text || '/' || v_message.message_key);
                    end if;
                end loop;
            end loop;
            for i in v_from .. v_to loop
                v_tried := v_tried || (v_tenants[i]::text || '/' || v_ids[i]::text);
            end loop;
            v_from := v_to + 1;
        end loop;
        exit when v_claimed >= p_limit;
        if v_tie is not null then
            v_after := v_tie;
            v_tie := null;
            v_tried := '{}';
        elsif v_count < v_round then
            exit;
        else
            v_tie := v_availables[v_count];
        end if;
    end loop;
end;
$$;

comment on function keel.claim_outbox(text, integer, interval, text) is
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): claims up to p_limit (1 to settings.max_batch_items) pending outbox messages of any tenant whose available_at has come, optionally only topics starting with p_topic_prefix, for p_relay until now + p_lease, by an unlocked candidate scan of message metadata as the relay login and then keel.claim_due_messages for each tenant''s candidates, on its node. Fair across tenants: half the batch (rounded down) is first shared equally among tenants with due messages (each one''s oldest), the rest of the batch is the oldest due messages of any tenant. Same contract as the PostgreSQL function: a new claim_token per message, rows locked by other transactions skipped, a message with a message_key not claimed while it is held or an earlier one of the same tenant and key is pending, at most one message of a key per claim, dead instead after settings.outbox_max_unreported_claims claims with no ack or nack (G6).';
