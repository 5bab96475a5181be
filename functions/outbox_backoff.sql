-- Outbox delivery (G6): the delay before a failed message is tried again.
create or replace function keel.outbox_backoff(p_attempts integer)
returns interval
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_base interval;
    v_cap interval;
    v_ceiling double precision;
begin
    select s.value::interval into v_base
    from keel.settings as s
    where s.setting = 'outbox_backoff_base';
    select s.value::interval into v_cap
    from keel.settings as s
    where s.setting = 'outbox_backoff_cap';
    v_base := coalesce(v_base, interval '1 second');
    v_cap := coalesce(v_cap, interval '1 hour');
    -- In seconds, so that a large attempt count cannot overflow an interval.
    v_ceiling := least(
        extract(epoch from v_cap)::double precision,
        extract(epoch from v_base)::double precision
        * power(2::double precision, least(greatest(coalesce(p_attempts, 1) - 1, 0), 60))
    );
    -- Full jitter: anywhere between now and the ceiling, so relays that failed together
    -- do not retry together.
    return make_interval(secs => random() * greatest(v_ceiling, 0));
end;
$$;

comment on function keel.outbox_backoff(integer) is
'Exponential backoff with full jitter, capped: random() * least(cap, base * 2^(attempts - 1)), with base = settings.outbox_backoff_base (default 1 second) and cap = settings.outbox_backoff_cap (default 1 hour); attempts is the number of attempts made so far. Not granted to any role.';
