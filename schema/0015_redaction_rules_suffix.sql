-- More secret-bearing key names (G9), and suffix rules for token-like names.
-- agentkeel:allow squawk.ban-drop-constraint (the check is widened: every row still passes)
alter table keel.redaction_rules drop constraint redaction_rules_match_check;

alter table keel.redaction_rules
add constraint redaction_rules_match_check
check (match in ('exact', 'contains', 'suffix')) not valid;
-- Not validated: it only widens the dropped check, which every existing row passed.

update keel.redaction_rules
set match = 'suffix', description = 'tokens of every kind: id, auth, bearer, csrf, api tokens ...'
where pattern = 'token';

insert into keel.redaction_rules (pattern, match, description)
values
('pwd', 'contains', 'passwords'),
('passphrase', 'contains', 'passphrases'),
('bearer', 'contains', 'bearer credentials'),
('jwt', 'contains', 'JSON web tokens'),
('otp', 'suffix', 'one-time passwords (otp, totp, hotp)'),
('otpcode', 'contains', 'one-time codes'),
('pin', 'exact', 'PINs'),
('pincode', 'contains', 'PIN codes'),
('cvv', 'contains', 'card verification values'),
('cvc', 'contains', 'card verification codes'),
('cardnumber', 'contains', 'payment card numbers'),
('securitycode', 'contains', 'card and account security codes'),
('accesskey', 'contains', 'access keys (cloud credentials)'),
('signingkey', 'contains', 'signing keys'),
('encryptionkey', 'contains', 'encryption keys'),
('privkey', 'contains', 'private keys'),
('sshkey', 'contains', 'SSH keys'),
('mnemonic', 'contains', 'wallet recovery phrases'),
('seedphrase', 'contains', 'wallet recovery phrases'),
('sessionid', 'contains', 'session identifiers that authenticate'),
('xsrf', 'contains', 'XSRF tokens'),
('csrf', 'contains', 'CSRF tokens');

comment on table keel.redaction_rules is
'Keys that stored payloads may not carry, at any depth (G9). A key is folded by keel.fold_key (compatibility decomposition, Unicode confusables to ASCII, lower case, letters and digits only: "API-Key", "apiKey" and "аpikey" with a Cyrillic a all become "apikey") and refused when it equals an exact pattern, contains a contains pattern or ends with a suffix pattern.';
comment on column keel.redaction_rules.match is
'exact: the folded key equals the pattern ("pin" refuses "PIN" but not "pinned"); contains: the folded key contains it; suffix: the folded key ends with it ("token" refuses "id_token" and "githubToken" but not "max_tokens").';
