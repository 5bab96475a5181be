-- keel.uuid_v7() without its SET clause: a function with SET search_path is never inlined,
-- and each call saved and restored the setting (about 50 µs, once per outbox message,
-- operation and task). A SQL-standard body binds every name when it is created, so the
-- caller's search_path cannot redirect it, and the planner inlines it into the default.
create or replace function keel.uuid_v7()
returns uuid
language sql
volatile
parallel safe
return pg_catalog.encode(
    pg_catalog.set_bit(
        pg_catalog.set_bit(
            pg_catalog.overlay(
                pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
                pg_catalog.substr(
                    pg_catalog.int8send(
                        pg_catalog.floor(
                            pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000
                        )::bigint
                    ),
                    3
                ),
                1,
                6
            ),
            52,
            1
        ),
        53,
        1
    ),
    'hex'
)::uuid;

comment on function keel.uuid_v7() is
'A version 7 uuid: 48 bits of Unix milliseconds, then random bits. Used as the default id of every keel table. Its names are bound when it is created (SQL-standard body), so it needs no SET search_path and is inlined.';
