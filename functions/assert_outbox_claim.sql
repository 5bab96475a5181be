-- Outbox delivery (G6): the one fencing check on a relay's claim. ack, nack and release
-- call it before writing.
create or replace function keel.assert_outbox_claim(p_message keel.outbox, p_claim_token bigint)
returns void
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    -- An expired claim whose token is still current may still be acked, nacked or
    -- released: nobody has claimed the message since, so the holder's word is the
    -- freshest there is (the claim index already offers it to others, and the first
    -- claim to lock it makes this token stale).
    if p_claim_token is null
        or p_message.claim_token <> p_claim_token
        or p_message.claimed_by is null
        or p_message.state <> 'pending' then
        raise exception using
            errcode = '55K08',
            message = format('outbox claim lost on message %s', p_message.message_id),
            detail = case
                when p_claim_token is null then 'No claim token was presented.'
                -- The current token is never shown: it is the claimer's credential.
                when p_message.claim_token <> p_claim_token then format(
                    'Token %s is not the current claim token (the message was claimed again after the claim expired, or the token was never this message''s).',
                    p_claim_token
                )
                when p_message.state <> 'pending' then format(
                    'The message is %s.', p_message.state
                )
                else format(
                    'Token %s was presented, but the claim was released or nacked.', p_claim_token
                )
            end,
            hint = 'Another relay owns this message now: drop the result (consumers dedupe by message id) and carry on.';
    end if;
end;
$$;

comment on function keel.assert_outbox_claim(keel.outbox, bigint) is
'Raises outbox_claim_lost (55K08) unless p_claim_token is the message''s current claim token and the claim is still open (pending, not released or nacked). An expired claim that nobody has taken over still passes. The single fencing check behind keel.ack_outbox, keel.nack_outbox and keel.release_outbox (G6).';
