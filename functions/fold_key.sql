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
return case
    when pg_catalog.octet_length(p_key) = pg_catalog.char_length(p_key)
        then pg_catalog.regexp_replace(pg_catalog.lower(p_key), '[^a-z0-9]+', '', 'g')
    else pg_catalog.regexp_replace(
        pg_catalog.lower(
            pg_catalog.translate(
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
        ),
        '[^a-z0-9]+', '', 'g'
    )
end;

comment on function keel.fold_key(text) is
'The folded form of a payload key that keel.redaction_rules patterns are matched against: NFKD, Unicode confusables mapped to ASCII, lower case, a-z and 0-9 only. "Pаss-Wörd" (Cyrillic a) folds to "password".';
