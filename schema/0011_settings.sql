-- Operator settings that SQL functions read (global, per node).
create table keel.settings (
    setting text not null,
    value text not null,
    description text not null,
    constraint settings_pkey primary key (setting),
    constraint settings_setting_check check (setting ~ '^[a-z][a-z0-9_]{0,62}$')
);

insert into keel.settings (setting, value, description)
values (
    'max_event_payload_bytes', '65536',
    'Largest event payload, in bytes of its JSON text, that keel.transition_task accepts (G9).'
);

comment on table keel.settings is
'Operator settings read by the keel functions. Change a value with UPDATE as keel_owner; the functions read it on every call.';
