-- Time-ordered uuid (RFC 9562 version 7) generated in the database.
-- PostgreSQL 18 has uuidv7(); 15-17 do not, so agentkeel ships its own and
-- uses it on every version to keep one code path.
create function keel.uuid_v7()
returns uuid
language sql
volatile
parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select encode(
        set_bit(
            set_bit(
                overlay(
                    uuid_send(gen_random_uuid())
                    placing substring(
                        int8send(
                            floor(extract(epoch from clock_timestamp()) * 1000)::bigint
                        ) from 3
                    )
                    from 1 for 6
                ),
                52, 1
            ),
            53, 1
        ),
        'hex'
    )::uuid
$$;

comment on function keel.uuid_v7() is
'A version 7 uuid: 48 bits of Unix milliseconds, then random bits. Used as the default id of every keel table.';
