-- Outbox delivery (G6): how many claims of a message may end with no ack or nack before
-- the next claim marks it dead.
create or replace function keel.outbox_max_unreported_claims()
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
begin
    select s.value::integer into v_max
    from keel.settings as s
    where s.setting = 'outbox_max_unreported_claims';
    return greatest(coalesce(v_max, 20), 1);
end;
$$;

comment on function keel.outbox_max_unreported_claims() is
'settings.outbox_max_unreported_claims (else 20, at least 1): the claims of an outbox message that may end with no ack or nack before the next claim marks it dead. Not granted to any role.';
