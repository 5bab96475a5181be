-- Argument checks shared by every lease-granting function.
create or replace function keel.check_lease_request(
    p_owner text,
    p_lease interval
)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_owner is null or char_length(p_owner) not between 1 and 200 then
        raise exception using
            errcode = '22K01',
            message = 'lease owner must be 1 to 200 characters';
    end if;
    if p_lease is null or p_lease <= interval '0' or p_lease > interval '7 days' then
        raise exception using
            errcode = '22K01',
            message = format('lease duration must be positive and at most 7 days, not %s', p_lease),
            hint = 'Use a short lease and renew it with keel.renew_lease while working.';
    end if;
end;
$$;

comment on function keel.check_lease_request(text, interval) is
'Raises invalid_argument (22K01) unless the owner is 1-200 characters and the lease between 0 and 7 days.';
