-- Tenant isolation (G1): the stamp that ties a tenant context to one transaction.
-- A SQL function with a standard body, inlined into keel.current_tenant() and so into every
-- policy: the start time of the current transaction, in epoch seconds with microseconds.
-- A context is honoured only when keel.context_stamp holds this transaction's stamp, so a
-- value left at session level by an earlier transaction (a plain SET, set_config(..., false),
-- or another client of the same pooled server connection) is ignored.
create or replace function keel.context_stamp()
returns text
language sql
stable
return (extract(epoch from pg_catalog.now()))::text;

comment on function keel.context_stamp() is
'This transaction''s stamp (now() as epoch seconds, to the microsecond). keel.current_tenant() honours a tenant context only while the setting keel.context_stamp equals it; keel.bind_tenant_context() sets it with SET LOCAL (G1).';
