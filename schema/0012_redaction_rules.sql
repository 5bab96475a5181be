-- The deny-list of secret-bearing keys refused in event payloads (G9).
create table keel.redaction_rules (
    pattern text not null,
    match text not null,
    description text,
    constraint redaction_rules_pkey primary key (pattern),
    constraint redaction_rules_pattern_check check (pattern ~ '^[a-z0-9]{2,64}$'),
    constraint redaction_rules_match_check check (match in ('exact', 'contains'))
);

insert into keel.redaction_rules (pattern, match, description)
values
('password', 'contains', 'passwords and passphrases'),
('passwd', 'contains', 'passwords'),
('secret', 'contains', 'client secrets, secret keys'),
('apikey', 'contains', 'API keys'),
('privatekey', 'contains', 'private keys'),
('accesstoken', 'contains', 'OAuth access tokens'),
('refreshtoken', 'contains', 'OAuth refresh tokens'),
('sessiontoken', 'contains', 'session tokens'),
('token', 'exact', 'bearer tokens'),
('authorization', 'contains', 'Authorization headers'),
('cookie', 'contains', 'cookies'),
('credentials', 'contains', 'credential bundles'),
('prompt', 'exact', 'a full prompt'),
('systemprompt', 'exact', 'a full system prompt'),
('messages', 'exact', 'a full chat transcript'),
('ssn', 'exact', 'social security numbers'),
('creditcard', 'contains', 'card numbers');

comment on table keel.redaction_rules is
'Keys that event payloads may not carry, at any depth (G9). A payload key is normalized (lower-case, letters and digits only: "API-Key" and "apiKey" become "apikey") and refused when it equals an exact pattern or contains a contains pattern.';
comment on column keel.redaction_rules.match is
'exact: the normalized key equals the pattern ("token" refuses "token" but not "max_tokens"); contains: the normalized key contains it.';
