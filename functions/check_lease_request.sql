-- Argument checks shared by every lease-granting function.
drop function if exists keel.check_lease_request(text, interval);

create or replace function keel.check_lease_request(
    p_owner text,
    p_lease interval,
    p_now timestamptz
)
returns timestamptz
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_owner is null or char_length(p_owner) not between 1 and 200 then
        raise exception using
            errcode = '22K01',
            message = 'lease owner must be 1 to 200 characters';
    end if;
    return keel.interval_end('lease duration', p_lease, p_now, interval '7 days');
end;
$$;

comment on function keel.check_lease_request(text, interval, timestamptz) is
'Raises invalid_argument (22K01) unless the owner is 1-200 characters and p_now + p_lease lies after p_now and at most 7 days later; returns that expiry.';
