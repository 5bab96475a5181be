-- agentkeel check: views in keel run with the invoker's rights, so RLS applies to the
-- reader, not to the view owner (G1).
select
    'views_security_invoker' as rule,
    'G1' as guarantee,
    'error' as level,
    c.oid::regclass::text as object,
    'the view is not security_invoker: it reads with its owner''s rights, around RLS' as problem,
    format('ALTER VIEW %s SET (security_invoker = true);', c.oid::regclass) as remedy
from pg_catalog.pg_class as c
inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
where
    n.nspname = 'keel'
    and c.relkind = 'v'
    and not coalesce(
        'security_invoker=true' = any(c.reloptions) or 'security_invoker=on' = any(c.reloptions),
        false
    )
order by 4;
