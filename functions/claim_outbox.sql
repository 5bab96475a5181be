-- Outbox delivery (G6): a relay claims a batch of due messages of any tenant.
-- agentkeel:allow citus.tenant_filter (the relay's one cross-tenant claim, replaced on Citus)
-- agentkeel:allow citus.set_local_autocommit (on PostgreSQL its SET LOCALs hold in autocommit too; on Citus this claim is replaced by the candidate scan of CITUS.md (b) 2)
-- The shape of keel.claim_next_task: FOR UPDATE SKIP LOCKED scans, with the
-- scan_all_tenants flag on for those statements alone (policies outbox_claim_scan and
-- outbox_claim_lock). First the fair share: half the batch is shared equally among the
-- tenants with due messages, each one's oldest first (keel.outbox_tenants_due), so one
-- tenant's flood does not stand in front of the others' messages. Then rounds over the
-- claim index (messages not held), oldest available_at first, each after the last, for the
-- rest of the batch. A row another transaction has locked is skipped, never waited on and
-- never allowed to hide the rows behind it, so no tenant can keep the relay from another
-- tenant's messages. No high-water mark: message ids commit out of order, so every pending
-- row is looked at, whatever its id.
create or replace function keel.claim_outbox(
    p_relay text,
    p_limit integer default 100,
    p_lease interval default '30 seconds',
    p_topic_prefix text default null
)
returns setof keel.outbox
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
-- One plan per session, made once, as in keel.claim_next_tasks: it reads the claim index
-- in available_at order and checks each candidate's key through its index, whatever the
-- statistics say. With a large held-back backlog a custom plan's estimate was far off: it
-- passed jit_above_cost, and compiling it (about 20 ms) cost forty times the scan.
set plan_cache_mode = force_generic_plan
set enable_sort = off
set enable_seqscan = off
set jit = off
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_message keel.outbox;
    v_row record;
    v_asked integer;
    v_seen integer;
    v_claimed integer := 0;
    v_deaths integer;
    -- Messages claimed this often with no ack or nack go dead instead (claim_locked_message).
    v_max_claims integer := keel.outbox_max_unreported_claims();
    v_dying_tenants uuid[];
    v_dying_ids uuid[];
    v_grant integer;
    -- Each claimed message's token comes from this and its id (keel.claim_token_of).
    v_secret bytea := keel.claim_secret();
    -- Where the next round starts in the claim index (available_at, created_at, position,
    -- message_id: oldest first, a transition's messages in their order): no round walks
    -- again what an earlier one walked past.
    v_after_at timestamptz := '-infinity';
    v_after_created timestamptz := '-infinity';
    v_after_position integer := 0;
    v_after_id uuid := '00000000-0000-0000-0000-000000000000';
    v_tenants uuid[];
    v_ids uuid[];
    -- The keys (tenant/key) of the messages this call has claimed: a claim returns at most
    -- one message of a key, so a relay may send a batch's messages at once.
    v_claimed_keys text[] := '{}';
    v_key text;
    v_behind_tenants uuid[];
    v_behind_ids uuid[];
    -- The fair share: the tenants with due messages (at most one per slot of the batch),
    -- and how many of its oldest each may have in the first round.
    v_due uuid[];
    v_fair boolean;
    v_share integer;
begin
    v_expires := keel.check_lease_request(p_relay, p_lease, v_now);
    perform keel.check_claim_limit(p_limit);
    -- Half the batch (rounded down) is shared among the tenants with due messages; the
    -- rest, and whatever the shares leave, goes oldest first, so however the tenants are
    -- found, the oldest due message is never left behind.
    perform keel.set_claim_scan(true);
    v_due := keel.outbox_tenants_due(v_now, p_topic_prefix, p_limit / 2);
    perform keel.set_claim_scan(false);
    v_fair := cardinality(v_due) >= 1;
    v_share := ceil((p_limit / 2)::numeric / greatest(cardinality(v_due), 1));

    -- The fair share, then rounds over the claim index, each after the last: every row a
    -- round sees leaves the scan (claimed, dead, or held) or is passed for good (behind a
    -- message in flight), and a claim comes back short only when nothing more is claimable.
    loop
        v_asked := p_limit - v_claimed;
        v_seen := 0;
        v_deaths := 0;
        v_tenants := '{}';
        v_ids := '{}';
        v_dying_tenants := '{}';
        v_dying_ids := '{}';
        v_behind_tenants := '{}';
        v_behind_ids := '{}';
        -- Only this statement sees and locks rows of every tenant; the flag is off again
        -- before anything is written.
        perform keel.set_claim_scan(true);
        for v_row in
            select
                o.tenant_id,
                o.message_id,
                o.message_key,
                o.claims,
                o.available_at,
                o.created_at,
                o.position,
                -- Per-key ordering: a message is claimed only while no earlier message of
                -- the same tenant and key is pending (waiting, in backoff or claimed).
                (
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
                ) as head,
                -- Behind a message some relay holds now: its ack may come before this
                -- claim commits and, not seeing this row held yet, promote nothing; so such
                -- a row is left as it is, not held.
                exists (
                    select 1
                    from keel.outbox as e
                    where e.tenant_id = o.tenant_id
                        and e.message_key = o.message_key
                        and e.state = 'pending'
                        and e.claimed_by is not null
                        and e.available_at > v_now
                        and (e.created_at, e.position, e.message_id)
                        < (o.created_at, o.position, o.message_id)
                ) as behind_in_flight
            from (
                -- The first round: each tenant's oldest v_share, one probe of its range
                -- of outbox_tenant_claimable_idx.
                select f.*
                from unnest(case when v_fair then v_due end) as t (tenant_id)
                cross join lateral (
                    select
                        s.tenant_id,
                        s.message_id,
                        s.message_key,
                        s.claims,
                        s.available_at,
                        s.created_at,
                        s.position
                    from keel.outbox as s
                    where s.tenant_id = t.tenant_id
                        -- "Due" as keel.outbox_tenants_due says it: only this index.
                        and (s.tenant_id, s.available_at) <= (t.tenant_id, v_now)
                        and s.state = 'pending'
                        and not s.held
                        and (p_topic_prefix is null or starts_with(s.topic, p_topic_prefix))
                    order by s.available_at, s.created_at, s.position, s.message_id
                    limit v_share
                    for update of s skip locked
                ) as f
                union all
                -- Every other round: the claim index, oldest first, after the last round,
                -- in this order (the loop below keeps where the round ended).
                select g.*
                from (
                    select
                        s.tenant_id,
                        s.message_id,
                        s.message_key,
                        s.claims,
                        s.available_at,
                        s.created_at,
                        s.position
                    from keel.outbox as s
                    where not v_fair
                        and s.state = 'pending'
                        and s.available_at <= v_now
                        and (s.available_at, s.created_at, s.position, s.message_id)
                        > (v_after_at, v_after_created, v_after_position, v_after_id)
                        and (p_topic_prefix is null or starts_with(s.topic, p_topic_prefix))
                        -- The claim index holds no held message. `held` is decided without
                        -- locks, so a message written while another writer's first message
                        -- of its key was not yet committed is not held: the check above
                        -- orders it, and this claim holds it, so no claim reads it again
                        -- until its key's head has gone.
                        and not s.held
                    order by s.available_at, s.created_at, s.position, s.message_id
                    limit v_asked
                    for update of s skip locked
                ) as g
            ) as o
        loop
            v_seen := v_seen + 1;
            if not v_fair then
                v_after_at := v_row.available_at;
                v_after_created := v_row.created_at;
                v_after_position := v_row.position;
                v_after_id := v_row.message_id;
            end if;
            v_key := v_row.tenant_id::text || '/' || v_row.message_key;
            if v_row.head and v_key = any(v_claimed_keys) then
                -- The head of a key whose message this call claimed in an earlier round:
                -- its writer committed after that message's (writers of one key that
                -- overlap are ordered by nothing). Left as it is, for a later claim.
                null;
            elsif v_row.head and v_row.claims >= v_max_claims then
                v_dying_tenants := v_dying_tenants || v_row.tenant_id;
                v_dying_ids := v_dying_ids || v_row.message_id;
            elsif v_row.head then
                v_tenants := v_tenants || v_row.tenant_id;
                v_ids := v_ids || v_row.message_id;
            elsif not v_row.behind_in_flight then
                v_behind_tenants := v_behind_tenants || v_row.tenant_id;
                v_behind_ids := v_behind_ids || v_row.message_id;
            end if;
        end loop;
        perform keel.set_claim_scan(false);

        -- The writes: each names its row's tenant and id (policy outbox_delivery_write).
        -- Holds first: a death below then promotes its key's next message, held or not.
        set local keel.outbox_delivery = on;
        for i in 1 .. coalesce(array_length(v_behind_ids, 1), 0) loop
            update keel.outbox as o
            set held = true
            where o.tenant_id = v_behind_tenants[i] and o.message_id = v_behind_ids[i];
        end loop;
        for i in 1 .. coalesce(array_length(v_dying_ids, 1), 0) loop
            -- Dead instead of claimed; it makes its key's next message claimable.
            perform keel.claim_locked_message(
                v_dying_tenants[i], v_dying_ids[i], p_relay, v_now, v_expires
            );
            v_deaths := v_deaths + 1;
        end loop;
        -- The claims of the round, in one statement (the form of keel.claim_locked_message,
        -- whose lock this scan took already), returned in the scan's order. The shares,
        -- rounded up, may add up to a few more than the batch.
        v_grant := least(coalesce(array_length(v_ids, 1), 0), p_limit - v_claimed);
        for v_message in
            with granted as (
                update keel.outbox as o
                set
                    claim_token = keel.claim_token_of(v_secret, o.message_id),
                    claimed_by = p_relay,
                    claimed_at = v_now,
                    available_at = v_expires,
                    claims = o.claims + 1
                from unnest(v_tenants[1:v_grant], v_ids[1:v_grant]) with ordinality
                    as c (tenant_id, message_id, n)
                where o.tenant_id = c.tenant_id and o.message_id = c.message_id
                returning o as message, c.n
            )
            select (g.message).* from granted as g order by g.n
        loop
            v_claimed := v_claimed + 1;
            if v_message.message_key is not null then
                v_claimed_keys := v_claimed_keys
                    || (v_message.tenant_id::text || '/' || v_message.message_key);
            end if;
            return next v_message;
        end loop;
        set local keel.outbox_delivery = off;
        exit when v_claimed >= p_limit;
        if v_fair then
            -- The rest of the batch from the oldest message of any tenant.
            v_fair := false;
        elsif v_deaths > 0 then
            -- A death made its key's next message claimable, maybe one this round passed:
            -- the next round starts from the beginning again (deaths are few).
            v_after_at := '-infinity';
            v_after_created := '-infinity';
            v_after_position := 0;
            v_after_id := '00000000-0000-0000-0000-000000000000';
        elsif v_seen < v_asked then
            exit;
        end if;
    end loop;
end;
$$;

comment on function keel.claim_outbox(text, integer, interval, text) is
'Claims up to p_limit (1 to settings.max_batch_items) pending outbox messages of any tenant whose available_at has come, optionally only topics starting with p_topic_prefix, for p_relay until now + p_lease (at most 7 days). Fair across tenants: half the batch (rounded down) is first shared equally among tenants with due messages (each one''s oldest), found by keel.outbox_tenants_due; the rest of the batch is the oldest due messages of any tenant, so the oldest due message is in every claim of two or more. Each is returned with its new claim_token (the fence ack, nack and release must present), claimed_by, available_at = the claim''s expiry and claims + 1 (attempts count failed deliveries: nacks). Rows locked by other transactions are skipped: concurrent relays never wait on or share a message. A message with a message_key is not claimed while it is held (keel.outbox.held) or while an earlier message (created_at, position, message_id) of the same tenant and key is pending or claimed; one the claim finds in that case is held from then on, unless the earlier one is in flight. A claim returns at most one message of a key (a writer of the key that committed during the claim, after the writer of a message it claimed, waits for a later claim). A message already claimed settings.outbox_max_unreported_claims times with no ack or nack goes dead instead. Needs no tenant context (G6).';
