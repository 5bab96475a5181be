-- Redaction (G9): fold a payload key to the form the deny-list is matched against.
-- Compatibility decomposition (fullwidth, ligatures, mathematical letters, accents split
-- off), then characters that look like one ASCII letter or digit (Unicode TR39
-- confusables: Cyrillic, Greek, Armenian, Cherokee ... 523 characters, taken from
-- confusables.txt as packaged by confusable-homoglyphs 3.3.1) become that letter, then
-- lower case, then everything but a-z and 0-9 is dropped. Upper- and lower-case forms are
-- both listed, so the result does not depend on the database's LC_CTYPE.
create or replace function keel.fold_key(p_key text)
returns text
language sql
immutable
parallel safe
-- A key of ASCII characters only (octet_length = char_length in UTF-8, which normalize()
-- requires) is its own NFKD form and holds no confusable: it takes the short branch,
-- the same result without the 523-character translate (20 us a key, then 2).
--
-- Any other key: translate() compares each character with the from-list entry by entry, so
-- the whole 523-entry list cost about 20 us a key. It maps each character on its own, and
-- an NFKD form holds only the NFKD forms of the key's characters, so a key whose
-- characters all lie in a few Unicode blocks needs only the entries that those blocks'
-- NFKD forms can hold, in the same pairs. A regular expression over the key as given picks
-- the first short list that covers it: lower-case Cyrillic, all Cyrillic, Greek, or Latin
-- Extended-B, IPA and Latin Extended Additional, each with ASCII, Latin-1, Latin
-- Extended-A, combining accents and fullwidth ASCII (21 to 62 entries), and before them
-- ASCII with the lower-case Cyrillic letters that NFKD leaves alone, which skips NFKD too.
-- A lower-case Cyrillic key costs an eighth of what it did. The micro sign (U+00B5, NFKD
-- Greek mu) is in none of them. A key none covers whose NFKD form holds no entry at all
-- (CJK, Arabic, Hebrew, Hangul ...) is its own translation; only the rest (Armenian,
-- Cherokee, mixed scripts ...) pay the whole list, and about 1 us more for the tests
-- before it. tests/test_fold_key.py keeps the single list as the reference and checks
-- every code point under every branch against it.
return case
    when pg_catalog.octet_length(p_key) = pg_catalog.char_length(p_key)
        then pg_catalog.regexp_replace(pg_catalog.lower(p_key), '[^a-z0-9]+', '', 'g')
    else pg_catalog.regexp_replace(
        pg_catalog.lower(case
            -- ASCII and lower-case Cyrillic letters that are their own NFKD form (not й ё ѐ ѓ
            -- ї ќ ѝ ў) and no combining mark: the key is its own NFKD form
            when p_key ~ '^[\u0001-\u007f\u0430-\u0438\u043a-\u044f\u0452\u0454-\u0456\u0458-\u045b\u045f]*$'
                then pg_catalog.translate(p_key, 'абвгезкмнорстухьѕіј', 'a6bre3kmhopctyxbsij')
            -- Latin letters (NFKD: ASCII and accents), lower-case Cyrillic
            when p_key ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u036f\u0430-\u045f\uff01-\uff5e]*$'
                then pg_catalog.translate(
                    pg_catalog.normalize(p_key, 'NFKD'),
                    '×ıабвгезкмнорстухьѕіј',
                    'xia6bre3kmhopctyxbsij'
                )
            -- Latin letters, all Cyrillic
            when p_key ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u036f\u0400-\u052f\uff01-\uff5e]*$'
                then pg_catalog.translate(
                    pg_catalog.normalize(p_key, 'NFKD'),
                    '×ıЅІЈАБВГЕЗКМНОРСТУХЬабвгезкмнорстухьѕіјѠѡѴѵҮүҺһҼҽӀӏӠӡԀԁԌԍԚԛԜԝ',
                    'xisija6bre3kmhopctyxba6bre3kmhopctyxbsijwwvvyyhheeii33ddggqqww'
                )
            -- Latin letters, Greek
            when p_key ~ '^[\u0001-\u00b4\u00b6-\u017f\u0300-\u03ff\u1f00-\u1fff\uff01-\uff5e]*$'
                then pg_catalog.translate(
                    pg_catalog.normalize(p_key, 'NFKD'),
                    '×ıͿΑΒΓΕΖΗΙΚΜΝΟΡΣΤΥΧαβγεζηικμνορςστυχϜϝϨϩϳϺϻ',
                    'xijabyezhikmvopctuxabyezhikmvopcotuxff22jmm'
                )
            -- Latin letters, Latin Extended-B, IPA, Latin Extended Additional
            when p_key ~ '^[\u0001-\u00b4\u00b6-\u036f\u1e00-\u1eff\uff01-\uff5e]*$'
                then pg_catalog.translate(
                    pg_catalog.normalize(p_key, 'NFKD'),
                    '×ıƄƅƍƔƖƜƦƧƨƲƷƼƽǀȜȝȢȣɑɜɡɣɩɪɯʀʋʏʒʝẝỾỿ',
                    'xibbgyiwr22u3ssl3388a3gyiiwruy3jfyy'
                )
            -- no entry of the list in the NFKD form: nothing to translate
            when
                pg_catalog.normalize(p_key, 'NFKD') !~ (
                    '['
                    || '×ıƄƅƍƔƖƜƦƧƨƲƷƼƽǀȜȝȢȣɑɜɡɣɩɪɯʀʋʏʒʝͿΑΒΓΕΖΗΙΚΜΝΟΡΣΤΥΧαβγεζηικμνο'
                    || 'ρςστυχϜϝϨϩϳϺϻЅІЈАБВГЕЗКМНОРСТУХЬабвгезкмнорстухьѕіјѠѡѴѵҮүҺһҼ'
                    || 'ҽӀӏӠӡԀԁԌԍԚԛԜԝԱԳԶՀՈՌՍՏՑՔՕագզհոռստցքօ۱۵۷०০৪৭੦੧੪૦ଠ୦୨௦౦೦ഠ൦൭๐໐ဝ၀ყ'
                    || 'ჿሀዐᎠᎡᎢᎥᎩᎪᎫᎬᎱᎳᎷᎻᎽᏀᏂᏃᏎᏏᏒᏔᏕᏙᏚᏞᏟᏢᏦᏧᏮᏳᏴᏻᏼᐯᑌᑭᑯᑲᒍᒪᒿᕁᕼᕽᖇᖯᖴᗅᗞᗪᗰᗷ᙭᙮ᚷᛁᛕ'
                    || 'ᛖᲧᲿᴄᴏᴑᴜᴠᴡᴢᴦᶃᶌẝỾỿ℮∣∨∪⊤⋁⋃⋿⍳⍴⍺⏽│╳⟙⤫⤬⨯ⱭⲄⲅⲎⲏⲒⲓⲔⲕⲘⲙⲚⲛⲞⲟⲢⲣⲤⲥⲦⲧⲨⲩⲬⲭⳊ'
                    || 'ⳋⳌⳍⳐⳑⳒⳓⴸⴹⵏⵔⵕⵝ〇ꓐꓑꓒꓓꓔꓖꓗꓙꓚꓜꓝꓟꓠꓡꓢꓣꓦꓧꓪꓫꓬꓮꓰꓲꓳꓴꙄꙅꙆꙇꛟꛯꜱꝚꝛꝪꝫꝮꝯꞘꞙꞞꞟꞫꞬꞮ'
                    || 'ꞲꞳꞴꞵꬲꬵꬽꭇꭈꭎꭒꭓꭚꭰꭱꭲꭵꭹꭺꭻꭼꮁꮃꮇꮋꮍꮐꮒꮓꮞꮟꮢꮤꮥꮩꮪꮮꮯꮲꮶꮷꮾ𐊂𐊆𐊇𐊊𐊐𐊒𐊕𐊖𐊗𐊠𐊡𐊢𐊥𐊫𐊰𐊱𐊲𐊴'
                    || '𐋏𐋵𐌁𐌂𐌉𐌑𐌕𐌗𐌚𐌠𐌢𐐄𐐕𐐛𐐠𐐬𐐽𐑃𐑈𐒴𐓂𐓎𐓒𐓜𐓪𐓶𐓺𐔓𐔖𐔘𐔜𐔝𐔥𐔦𐔧𑓐𑜆𑜊𑜎𑜏𑢠𑢡𑢢𑢣𑢤𑢦𑢨𑢩𑢪𑢬𑢮𑢯𑢲𑢵𑢶𑢷𑢸𑢻𑢼𑣀'
                    || '𑣁𑣂𑣃𑣄𑣆𑣈𑣉𑣊𑣌𑣎𑣏𑣒𑣕𑣖𑣗𑣘𑣛𑣜𑣠𑣥𑣦𑣩𑣬𑣯𑣲𖼈𖼊𖼖𖼨𖼵𖼺𖼻𖽀𖽂𖽃𝈆𝈍𝈒𝈓𝈖𝈪🝌🝨'
                    || ']'
                )
                then pg_catalog.normalize(p_key, 'NFKD')
            else pg_catalog.translate(
                pg_catalog.normalize(p_key, 'NFKD'),
                '×ıƄƅƍƔƖƜƦƧƨƲƷƼƽǀȜȝȢȣɑɜɡɣɩɪɯʀʋʏʒʝͿΑΒΓΕΖΗΙΚΜΝΟΡΣΤΥΧαβγεζηικμνο'
                || 'ρςστυχϜϝϨϩϳϺϻЅІЈАБВГЕЗКМНОРСТУХЬабвгезкмнорстухьѕіјѠѡѴѵҮүҺһҼ'
                || 'ҽӀӏӠӡԀԁԌԍԚԛԜԝԱԳԶՀՈՌՍՏՑՔՕագզհոռստցքօ۱۵۷०০৪৭੦੧੪૦ଠ୦୨௦౦೦ഠ൦൭๐໐ဝ၀ყ'
                || 'ჿሀዐᎠᎡᎢᎥᎩᎪᎫᎬᎱᎳᎷᎻᎽᏀᏂᏃᏎᏏᏒᏔᏕᏙᏚᏞᏟᏢᏦᏧᏮᏳᏴᏻᏼᐯᑌᑭᑯᑲᒍᒪᒿᕁᕼᕽᖇᖯᖴᗅᗞᗪᗰᗷ᙭᙮ᚷᛁᛕ'
                || 'ᛖᲧᲿᴄᴏᴑᴜᴠᴡᴢᴦᶃᶌẝỾỿ℮∣∨∪⊤⋁⋃⋿⍳⍴⍺⏽│╳⟙⤫⤬⨯ⱭⲄⲅⲎⲏⲒⲓⲔⲕⲘⲙⲚⲛⲞⲟⲢⲣⲤⲥⲦⲧⲨⲩⲬⲭⳊ'
                || 'ⳋⳌⳍⳐⳑⳒⳓⴸⴹⵏⵔⵕⵝ〇ꓐꓑꓒꓓꓔꓖꓗꓙꓚꓜꓝꓟꓠꓡꓢꓣꓦꓧꓪꓫꓬꓮꓰꓲꓳꓴꙄꙅꙆꙇꛟꛯꜱꝚꝛꝪꝫꝮꝯꞘꞙꞞꞟꞫꞬꞮ'
                || 'ꞲꞳꞴꞵꬲꬵꬽꭇꭈꭎꭒꭓꭚꭰꭱꭲꭵꭹꭺꭻꭼꮁꮃꮇꮋꮍꮐꮒꮓꮞꮟꮢꮤꮥꮩꮪꮮꮯꮲꮶꮷꮾ𐊂𐊆𐊇𐊊𐊐𐊒𐊕𐊖𐊗𐊠𐊡𐊢𐊥𐊫𐊰𐊱𐊲𐊴'
                || '𐋏𐋵𐌁𐌂𐌉𐌑𐌕𐌗𐌚𐌠𐌢𐐄𐐕𐐛𐐠𐐬𐐽𐑃𐑈𐒴𐓂𐓎𐓒𐓜𐓪𐓶𐓺𐔓𐔖𐔘𐔜𐔝𐔥𐔦𐔧𑓐𑜆𑜊𑜎𑜏𑢠𑢡𑢢𑢣𑢤𑢦𑢨𑢩𑢪𑢬𑢮𑢯𑢲𑢵𑢶𑢷𑢸𑢻𑢼𑣀'
                || '𑣁𑣂𑣃𑣄𑣆𑣈𑣉𑣊𑣌𑣎𑣏𑣒𑣕𑣖𑣗𑣘𑣛𑣜𑣠𑣥𑣦𑣩𑣬𑣯𑣲𖼈𖼊𖼖𖼨𖼵𖼺𖼻𖽀𖽂𖽃𝈆𝈍𝈒𝈓𝈖𝈪🝌🝨',
                'xibbgyiwr22u3ssl3388a3gyiiwruy3jjabyezhikmvopctuxabyezhikmvo'
                || 'pcotuxff22jmmsija6bre3kmhopctyxba6bre3kmhopctyxbsijwwvvyyhhe'
                || 'eii33ddggqqwwwqqhnnusgfowqqhnnusgfolovoo89o98ooo9ooooo9ooooy'
                || 'ouodrtiyajerwmhyghz4brwsvslcpkd6gbgbvupdbjl2xhxrbfaddmbxxxlk'
                || 'myocoouvwzrgyfyyelvutvueipallxtxxxarrhhllkkmmnnooppccttyyxx9'
                || '933ll66veloqxobpddtgkjczfmnlsrvhwxyaelou22iiv2s223399ffuu3gi'
                || 'jxbbeforruuxydrtiyajerwmhyghz4brwsvslcpkd6beflxopstabcfomtyx'
                || 'hzbclmtx8lxoclsoclsrou7rou7nokcvflxovwwwvsfiz7oz39e4l69ou5yv'
                || 'sfiz7oz39e4l69ou5yozwcxwcvtllrs3auy3v7frlct'
            )
        end),
        '[^a-z0-9]+', '', 'g'
    )
end;

comment on function keel.fold_key(text) is
'The folded form of a payload key that keel.redaction_rules patterns are matched against: NFKD, Unicode confusables mapped to ASCII, lower case, a-z and 0-9 only. "Pаss-Wörd" (Cyrillic a) folds to "password".';
