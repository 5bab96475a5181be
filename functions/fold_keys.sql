-- Redaction (G9): fold payload keys to the form the deny-list is matched against, all the
-- distinct keys of a payload in one call (keel.check_payload; keel.fold_key folds one key
-- with it). Compatibility decomposition (fullwidth, ligatures, mathematical letters,
-- accents split off), then characters that look like one ASCII letter or digit (Unicode
-- TR39 confusables: Cyrillic, Greek, Armenian, Cherokee ... 523 characters, taken from
-- confusables.txt as packaged by confusable-homoglyphs 3.3.1) become that letter, then
-- lower case, then everything but a-z and 0-9 is dropped. Upper- and lower-case forms are
-- both listed, so the result does not depend on the database's LC_CTYPE.
--
-- A key of ASCII characters only (octet_length = char_length in UTF-8, which normalize()
-- requires) is its own NFKD form and holds no confusable: lower case and drop, on its own.
--
-- The other keys are folded together, as one text: joined by U+0001 (written U+0002 where
-- a key holds it; both are ASCII controls, which NFKD, the map and lower() leave as they
-- are and the fold drops), folded, and cut apart at U+0001. NFKD and lower() act on each
-- key of the joined text as on the key alone: U+0001 is a starter (combining class 0),
-- which NFKD's reordering never passes, and it is neither cased nor case-ignorable, so no
-- case mapping that looks at neighbouring characters (final sigma, the Lithuanian and
-- Turkish dots) sees past it. The map maps each character on its own.
--
-- translate() compares each character with its from-list entry by entry: the whole
-- 523-entry list cost 20 us for a key of ten characters, 1 ms for one of 500. An NFKD form
-- holds only the NFKD forms of its text's characters, so when every character of the
-- joined text lies in a few Unicode blocks, only the entries that those blocks' NFKD forms
-- can hold are needed, in the same pairs. A regular expression over the text as given
-- picks the first short list that covers it (all of it: one key outside it sends the
-- whole text on): lower-case Cyrillic, all Cyrillic, Greek, or Latin Extended-B, IPA and
-- Latin Extended Additional, each with ASCII, Latin-1, Latin Extended-A, combining accents
-- and fullwidth ASCII (21 to 62 entries), and before them ASCII with the lower-case
-- Cyrillic letters that NFKD leaves alone, which skips NFKD too. The micro sign (U+00B5,
-- NFKD Greek mu) is in none of them. Text that none covers and whose NFKD form holds no
-- entry at all (CJK, Arabic, Hebrew, Hangul ...) is its own translation. The rest
-- (Armenian, Cherokee, keys mixing scripts, whatever an attacker chooses) goes through the
-- whole map one character at a time: a row for each character of the NFKD form, each
-- non-ASCII one looked up in the map as a jsonb object (a binary search), and where the
-- collation allows it (see plain_case) each character is folded right there, so that the
-- regular expression that drops the rest has nothing left to match (it costs a match for
-- each run of dropped characters). That costs about 0.2 us a character whatever the
-- characters are: a 64 KiB payload of such keys is checked in about 13 ms, where the
-- whole translate took up to 110 ms.
--
-- The map is written once, as the 523 characters and the 523 letters they become; the
-- jsonb object and the "no entry" class are built from it when a query is planned.
-- tests/test_fold_key.py keeps the single translate as the reference and checks every code
-- point under every branch, the confusables, and lists of random keys against it, in
-- databases whose default collation is an ICU locale too.
create or replace function keel.fold_keys(p_keys text[])
returns table (key text, folded text)
language sql
immutable
parallel safe
begin atomic
    with map as not materialized (
        select
            '×ıƄƅƍƔƖƜƦƧƨƲƷƼƽǀȜȝȢȣɑɜɡɣɩɪɯʀʋʏʒʝͿΑΒΓΕΖΗΙΚΜΝΟΡΣΤΥΧαβγεζηικμνο'
            || 'ρςστυχϜϝϨϩϳϺϻЅІЈАБВГЕЗКМНОРСТУХЬабвгезкмнорстухьѕіјѠѡѴѵҮүҺһҼ'
            || 'ҽӀӏӠӡԀԁԌԍԚԛԜԝԱԳԶՀՈՌՍՏՑՔՕագզհոռստցքօ۱۵۷०০৪৭੦੧੪૦ଠ୦୨௦౦೦ഠ൦൭๐໐ဝ၀ყ'
            || 'ჿሀዐᎠᎡᎢᎥᎩᎪᎫᎬᎱᎳᎷᎻᎽᏀᏂᏃᏎᏏᏒᏔᏕᏙᏚᏞᏟᏢᏦᏧᏮᏳᏴᏻᏼᐯᑌᑭᑯᑲᒍᒪᒿᕁᕼᕽᖇᖯᖴᗅᗞᗪᗰᗷ᙭᙮ᚷᛁᛕ'
            || 'ᛖᲧᲿᴄᴏᴑᴜᴠᴡᴢᴦᶃᶌẝỾỿ℮∣∨∪⊤⋁⋃⋿⍳⍴⍺⏽│╳⟙⤫⤬⨯ⱭⲄⲅⲎⲏⲒⲓⲔⲕⲘⲙⲚⲛⲞⲟⲢⲣⲤⲥⲦⲧⲨⲩⲬⲭⳊ'
            || 'ⳋⳌⳍⳐⳑⳒⳓⴸⴹⵏⵔⵕⵝ〇ꓐꓑꓒꓓꓔꓖꓗꓙꓚꓜꓝꓟꓠꓡꓢꓣꓦꓧꓪꓫꓬꓮꓰꓲꓳꓴꙄꙅꙆꙇꛟꛯꜱꝚꝛꝪꝫꝮꝯꞘꞙꞞꞟꞫꞬꞮ'
            || 'ꞲꞳꞴꞵꬲꬵꬽꭇꭈꭎꭒꭓꭚꭰꭱꭲꭵꭹꭺꭻꭼꮁꮃꮇꮋꮍꮐꮒꮓꮞꮟꮢꮤꮥꮩꮪꮮꮯꮲꮶꮷꮾ𐊂𐊆𐊇𐊊𐊐𐊒𐊕𐊖𐊗𐊠𐊡𐊢𐊥𐊫𐊰𐊱𐊲𐊴'
            || '𐋏𐋵𐌁𐌂𐌉𐌑𐌕𐌗𐌚𐌠𐌢𐐄𐐕𐐛𐐠𐐬𐐽𐑃𐑈𐒴𐓂𐓎𐓒𐓜𐓪𐓶𐓺𐔓𐔖𐔘𐔜𐔝𐔥𐔦𐔧𑓐𑜆𑜊𑜎𑜏𑢠𑢡𑢢𑢣𑢤𑢦𑢨𑢩𑢪𑢬𑢮𑢯𑢲𑢵𑢶𑢷𑢸𑢻𑢼𑣀'
            || '𑣁𑣂𑣃𑣄𑣆𑣈𑣉𑣊𑣌𑣎𑣏𑣒𑣕𑣖𑣗𑣘𑣛𑣜𑣠𑣥𑣦𑣩𑣬𑣯𑣲𖼈𖼊𖼖𖼨𖼵𖼺𖼻𖽀𖽂𖽃𝈆𝈍𝈒𝈓𝈖𝈪🝌🝨' as confusables,
            'xibbgyiwr22u3ssl3388a3gyiiwruy3jjabyezhikmvopctuxabyezhikmvo'
            || 'pcotuxff22jmmsija6bre3kmhopctyxba6bre3kmhopctyxbsijwwvvyyhhe'
            || 'eii33ddggqqwwwqqhnnusgfowqqhnnusgfolovoo89o98ooo9ooooo9ooooy'
            || 'ouodrtiyajerwmhyghz4brwsvslcpkd6gbgbvupdbjl2xhxrbfaddmbxxxlk'
            || 'myocoouvwzrgyfyyelvutvueipallxtxxxarrhhllkkmmnnooppccttyyxx9'
            || '933ll66veloqxobpddtgkjczfmnlsrvhwxyaelou22iiv2s223399ffuu3gi'
            || 'jxbbeforruuxydrtiyajerwmhyghz4brwsvslcpkd6beflxopstabcfomtyx'
            || 'hzbclmtx8lxoclsoclsrou7rou7nokcvflxovwwwvsfiz7oz39e4l69ou5yv'
            || 'sfiz7oz39e4l69ou5yozwcxwcvtllrs3auy3v7frlct' as letters
    ),

    -- the keys that are not ASCII only, in order ($1 is p_keys: sqlfluff reads a bare name as
    -- a column)
    other as (
        select array(
            select k.key
            from pg_catalog.unnest($1) with ordinality as k (key, n)
            where pg_catalog.octet_length(k.key) != pg_catalog.char_length(k.key)
            order by k.n
        ) as other_keys
    ),

    -- joined into one text; and whether lower() (the database's default collation: this
    -- body was parsed with it, whatever the caller's) lowers A-Z to a-z, as every collation
    -- does but Turkish and Azeri ones (I to dotless i)
    joined as (
        select
            j.text,
            pg_catalog.lower(pg_catalog.left(j.text, 0) || 'ABCDEFGHIJKLMNOPQRSTUVWXYZ')
            = 'abcdefghijklmnopqrstuvwxyz' as plain_case
        from (
            select pg_catalog.array_to_string(
                array(
                    select pg_catalog.replace(k.key, e'\u0001', e'\u0002')
                    from pg_catalog.unnest((select other.other_keys from other)) with ordinality as k (key, n)
                    order by k.n
                ),
                e'\u0001'
            ) as text
        ) as j
    ),

    -- its NFKD form, computed only when a branch below reads it
    nfkd as (
        select pg_catalog.normalize(joined.text, 'NFKD') as text
        from joined
    ),

    -- the NFKD form with each confusable replaced by its letter
    mapped as (
        select
            case
                -- ASCII and lower-case Cyrillic letters that are their own NFKD form (not й
                -- ё ѐ ѓ ї ќ ѝ ў) and no combining mark: the text is its own NFKD form
                when joined.text ~ '^[\u0001-\u007f\u0430-\u0438\u043a-\u044f\u0452\u0454-\u0456\u0458-\u045b\u045f]*$'
                    then pg_catalog.translate(joined.text, 'абвгезкмнорстухьѕіј', 'a6bre3kmhopctyxbsij')
                -- Latin letters (NFKD: ASCII and accents), lower-case Cyrillic
                when joined.text ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u036f\u0430-\u045f\uff01-\uff5e]*$'
                    then pg_catalog.translate(
                        (select nfkd.text from nfkd),
                        '×ıабвгезкмнорстухьѕіј',
                        'xia6bre3kmhopctyxbsij'
                    )
                -- Latin letters, all Cyrillic
                when joined.text ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u036f\u0400-\u052f\uff01-\uff5e]*$'
                    then pg_catalog.translate(
                        (select nfkd.text from nfkd),
                        '×ıЅІЈАБВГЕЗКМНОРСТУХЬабвгезкмнорстухьѕіјѠѡѴѵҮүҺһҼҽӀӏӠӡԀԁԌԍԚԛԜԝ',
                        'xisija6bre3kmhopctyxba6bre3kmhopctyxbsijwwvvyyhheeii33ddggqqww'
                    )
                -- Latin letters, Greek
                when joined.text ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u03ff\u1f00-\u1fff\uff01-\uff5e]*$'
                    then pg_catalog.translate(
                        (select nfkd.text from nfkd),
                        '×ıͿΑΒΓΕΖΗΙΚΜΝΟΡΣΤΥΧαβγεζηικμνορςστυχϜϝϨϩϳϺϻ',
                        'xijabyezhikmvopctuxabyezhikmvopcotuxff22jmm'
                    )
                -- Latin letters, Latin Extended-B, IPA, Latin Extended Additional
                when joined.text ~ '^[\u0001-\u00b4\u00b6-\u036f\u1e00-\u1eff\uff01-\uff5e]*$'
                    then pg_catalog.translate(
                        (select nfkd.text from nfkd),
                        '×ıƄƅƍƔƖƜƦƧƨƲƷƼƽǀȜȝȢȣɑɜɡɣɩɪɯʀʋʏʒʝẝỾỿ',
                        'xibbgyiwr22u3ssl3388a3gyiiwruy3jfyy'
                    )
                -- no entry of the map in the NFKD form: nothing to map
                when (select nfkd.text from nfkd) !~ ('[' || map.confusables || ']')
                    then (select nfkd.text from nfkd)
                -- the whole map, one character at a time (no ASCII character is an entry).
                -- With plain_case, each character is folded here, on its own, and lower()
                -- and the last step find nothing left to do (where many characters are
                -- dropped, that step costs a regular expression match for each): a-z, 0-9
                -- and U+0001 stay, A-Z become a-z, a confusable its letter, and the rest
                -- is dropped. Exact: lower() then lowers A-Z as chr(code + 32) does, no
                -- character's a-z or 0-9 depends on its neighbours (ICU's final sigma
                -- lowers Σ, which the map replaces; its Lithuanian dots only add U+0307
                -- after i and j; libc lowers each character alone), and no non-ASCII
                -- character of an NFKD form lowers to anything holding a-z or 0-9 (only
                -- U+0130 and U+212A would, and NFKD decomposes both; tests/test_fold_key.py
                -- checks every code point).
                else (
                    -- string_agg takes the characters in the order of the subquery, which
                    -- the ordinality gives without a sort and nothing after it can change
                    -- (PostgreSQL's documented way; array() and array_to_string() cost a
                    -- quarter more)
                    select pg_catalog.string_agg(f.c, '')
                    from (
                        select
                            case
                                when c.code between 97 and 122 then c.c  -- the most, first
                                when c.code > 127
                                    then coalesce(
                                        pg_catalog.jsonb_object(
                                            pg_catalog.string_to_array(map.confusables, null),
                                            pg_catalog.string_to_array(map.letters, null)
                                        ) operator (pg_catalog.->>) c.c,
                                        case when joined.plain_case then '' else c.c end
                                    )
                                when
                                    not joined.plain_case
                                    or c.code = 1
                                    or c.code between 48 and 57
                                    then c.c
                                when c.code between 65 and 90 then pg_catalog.chr(c.code + 32)
                                else ''
                            end as c
                        from (
                            select
                                c.c,
                                c.n,
                                pg_catalog.ascii(c.c) as code
                            from
                                pg_catalog.string_to_table((select nfkd.text from nfkd), null)
                                with ordinality as c (c, n)
                        ) as c
                        order by c.n
                    ) as f
                )
            end as text
        from joined
        cross join map
    ),

    -- lower case, a-z and 0-9 only, cut apart again: a part for each key of other (none
    -- when other is a single key that folds to nothing)
    parts as (
        select
            pg_catalog.string_to_array(
                pg_catalog.regexp_replace(pg_catalog.lower(mapped.text), '[^a-z0-9\u0001]+', '', 'g'),
                e'\u0001'
            ) as parts
        from mapped
    )

    select
        k.key,
        pg_catalog.regexp_replace(pg_catalog.lower(k.key), '[^a-z0-9]+', '', 'g') as folded
    from pg_catalog.unnest($1) as k (key)
    where pg_catalog.octet_length(k.key) = pg_catalog.char_length(k.key) or k.key is null

    union all

    -- each key of other with its part (unnest of two arrays pairs them: only that form may
    -- not be written pg_catalog.unnest)
    select
        f.key,
        coalesce(f.folded, '') as folded
    from unnest((select other.other_keys from other), (select parts.parts from parts)) as f (key, folded);
end;

comment on function keel.fold_keys(text[]) is
'Each key of p_keys with its keel.fold_key form (NFKD, Unicode confusables mapped to ASCII, lower case, a-z and 0-9 only), all folded in one pass: keel.check_payload folds a payload''s distinct keys with it. No choice of keys makes it slow.';
