-- Fairness (G5): a caller-supplied wake time lies between now and a documented maximum.
create or replace function keel.check_wake_at(p_wake_at timestamptz, p_now timestamptz)
returns timestamptz
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_max_delay interval;
begin
    if p_wake_at is null or p_wake_at <= p_now then
        -- Earlier than now means now: nobody queues ahead of work that is already due.
        return p_now;
    end if;
    select s.value::interval into v_max_delay
    from keel.settings as s
    where s.setting = 'max_wake_delay';
    -- Compared as timestamps: interval comparison counts a month as 30 days.
    if p_wake_at > p_now + coalesce(v_max_delay, interval '366 days') then
        raise exception using
            errcode = '22K01',
            message = format(
                'wake time %s is later than now + %s', p_wake_at, coalesce(v_max_delay, interval '366 days')
            ),
            hint = 'Wake the task sooner and let it wait again; settings.max_wake_delay sets the limit.';
    end if;
    return p_wake_at;
end;
$$;

comment on function keel.check_wake_at(timestamptz, timestamptz) is
'The wake time to store for a caller-supplied p_wake_at: now when it is null or in the past (so no tenant can place its tasks ahead of work already due), p_wake_at up to now + settings.max_wake_delay (default 366 days); later raises invalid_argument (22K01).';
