-- Outbox delivery (G6): per-key ordering without reading the held-back backlog.
-- Before, every claim looked at each due message and asked whether an earlier message of
-- its key was pending: with 10,000 messages queued behind one in-flight message of a key,
-- every claim of every relay read all of them (about 0.7 s a claim). Now only the head of
-- each key (its oldest pending message) is claimable; the rest are `held` and left out of
-- the claim index. keel.outbox_keys counts each key's pending messages, one row per key
-- with any: a writer of the key and the function that retires its head both take that
-- row's lock, so the two never miss each other (the next head is promoted in the same
-- transaction that retires the last one, and a new message is held exactly when its key
-- has a pending message).
create table keel.outbox_keys (
    tenant_id uuid not null,
    message_key text not null,
    pending integer not null,
    constraint outbox_keys_pkey primary key (tenant_id, message_key),
    constraint outbox_keys_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint outbox_keys_pending_check check (pending > 0)
);

comment on table keel.outbox_keys is
'One row per tenant and message key with pending outbox messages: how many (G6). Written only by keel.outbox_key_enter and keel.outbox_key_leave, whose row lock orders a key''s writers and the retirement of its head.';

alter table keel.outbox add column held boolean not null default false;

comment on column keel.outbox.held is
'True for a pending message with a key that is not its key''s head: it waits, out of the claim index, until the message before it is delivered or dead (keel.outbox_key_leave promotes the next, oldest by created_at, position, message_id).';

-- The messages pending now: the oldest of each key stays the head, the rest are held.
-- Row-level security (forced on keel.outbox) admits reading and writing every tenant's
-- messages, for keel_owner, only with the delivery flag on (policies outbox_delivery_*).
-- The counts go in one row at a time: on Citus an INSERT ... SELECT is shipped with COPY,
-- which row-level security refuses.
do $$
declare
    v_key record;
begin
    set local keel.outbox_delivery = on;
    update keel.outbox as o
    set held = true
    from (
        select
            p.tenant_id,
            p.message_id,
            row_number() over (
                partition by p.tenant_id, p.message_key
                order by p.created_at, p.position, p.message_id
            ) as place
        from keel.outbox as p
        where p.state = 'pending' and p.message_key is not null
    ) as r
    where o.tenant_id = r.tenant_id and o.message_id = r.message_id and r.place > 1;
    for v_key in
        select o.tenant_id, o.message_key, count(*)::integer as pending
        from keel.outbox as o
        where o.state = 'pending' and o.message_key is not null
        group by o.tenant_id, o.message_key
    loop
        insert into keel.outbox_keys (tenant_id, message_key, pending)
        values (v_key.tenant_id, v_key.message_key, v_key.pending);
    end loop;
    set local keel.outbox_delivery = off;
end;
$$;
