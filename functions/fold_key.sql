-- Redaction (G9): fold a payload key to the form the deny-list is matched against, as
-- keel.fold_keys folds it (NFKD, Unicode confusables to ASCII, lower case, a-z and 0-9
-- only; see functions/fold_keys.sql). keel.check_payload folds all of a payload's keys with
-- keel.fold_keys in one call; this is the same fold for one key, at about 20 us a call
-- (keel.fold_keys's plan runs for each): to fold many keys, call keel.fold_keys.
-- agentkeel:requires functions/fold_keys.sql
create or replace function keel.fold_key(p_key text)
returns text
language sql
immutable
parallel safe
return (select folded from keel.fold_keys(array[p_key]));

comment on function keel.fold_key(text) is
'The folded form of a payload key that keel.redaction_rules patterns are matched against: NFKD, Unicode confusables mapped to ASCII, lower case, a-z and 0-9 only. "Pаss-Wörd" (Cyrillic a) folds to "password". keel.fold_keys folds many keys at once, the same way.';
