-- Outbox delivery (G6): grant one claim on a locked outbox message, or make it dead. The
-- claims (keel.claim_outbox on PostgreSQL, keel.claim_due_messages) grant the messages
-- below the limit in one UPDATE of the same form themselves, and call this for those at
-- settings.outbox_max_unreported_claims, which it makes dead.
create or replace function keel.claim_locked_message(
    p_tenant_id uuid,
    p_message_id uuid,
    p_relay text,
    p_now timestamptz,
    p_expires timestamptz
)
returns keel.outbox
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_message keel.outbox;
    v_error text;
    v_token bigint := keel.claim_token_of(keel.claim_secret(), p_message_id);
begin
    -- Locked already by the caller's claim scan: this re-read is the row as it is now.
    v_message := keel.lock_outbox_message(p_tenant_id, p_message_id);
    if v_message.claims >= keel.outbox_max_unreported_claims() then
        -- Claim after claim ended with no ack or nack (a relay that crashes on this
        -- message, or loses its connection while delivering it): dead, not handed out
        -- forever. A crash between a publish and its ack is not a failed delivery, so it
        -- takes many of them, never a few.
        -- claimed_by names the relay whose claim found it dead: that relay logs it. The
        -- error is built here, not in the UPDATE: Citus refuses a STABLE function (format)
        -- over column references in an UPDATE of a distributed table.
        v_error := left(
            format(
                'claimed %s times and never acked or nacked (last error: %s)',
                v_message.claims, coalesce(v_message.last_error, 'none')
            ),
            4000
        );
        update keel.outbox as o
        set
            state = 'dead',
            dead_at = p_now,
            claimed_by = p_relay,
            last_error = v_error
        where o.tenant_id = p_tenant_id and o.message_id = p_message_id;
        if v_message.state = 'pending' then
            perform keel.count_pending_messages(p_tenant_id, -1);
        end if;
        perform keel.promote_outbox_head(p_tenant_id, v_message.message_key);
        return null;
    end if;
    update keel.outbox as o
    set
        claim_token = v_token,
        claimed_by = p_relay,
        claimed_at = p_now,
        available_at = p_expires,
        claims = o.claims + 1
    where o.tenant_id = p_tenant_id and o.message_id = p_message_id
    returning o.* into v_message;
    return v_message;
end;
$$;

comment on function keel.claim_locked_message(uuid, uuid, text, timestamptz, timestamptz) is
'Grants a claim on an outbox row the caller has locked: a new claim token (keel.claim_token_of), claimed_by, available_at = expiry (so an expired claim makes the message claimable again) and one more unreported claim (claims). A message already claimed settings.outbox_max_unreported_claims times with no ack or nack goes dead instead, and null is returned. Not granted to any role.';
