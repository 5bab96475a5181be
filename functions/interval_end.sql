-- Every interval a caller passes (lease, token lifetime, retention) is checked here, as
-- the timestamp it produces: interval comparison counts a month as 30 days and a year as
-- 360, so '1000 years -359999 days' compares as one day but ends 14 years later.
create or replace function keel.interval_end(
    p_what text,
    p_interval interval,
    p_now timestamptz,
    p_max interval
)
returns timestamptz
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_end timestamptz;
begin
    -- A coarse bound first, so the addition below cannot overflow the timestamp range.
    if p_interval is not null
        and p_interval between interval '-1000 years' and interval '1000 years' then
        v_end := p_now + p_interval;
    end if;
    if v_end is null or v_end <= p_now or v_end > p_now + p_max then
        raise exception using
            errcode = '22K01',
            message = format('%s must be positive and at most %s, not %s', p_what, p_max, p_interval),
            detail = 'Checked as the timestamp it produces from now, not as an interval.';
    end if;
    return v_end;
end;
$$;

comment on function keel.interval_end(text, interval, timestamptz, interval) is
'p_now + p_interval, when that lies after p_now and no later than p_now + p_max; otherwise raises invalid_argument (22K01) naming p_what. The one check for every caller-supplied interval.';
