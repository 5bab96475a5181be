"""keel.fold_key returns exactly what it returned with the single 523-entry translate:
ASCII keys take the same short branch, and any other key now takes the first of a few
short translate lists whose Unicode blocks cover it (see functions/fold_key.sql). The
function as it was is kept here, verbatim, as the reference, created under pg_temp, and
both are compared on every code point, every code point under every short list, the
confusables and their case forms, compatibility forms, and random keys.

Why this proves the two equal on every key: translate() maps each character on its own,
and an NFKD form is its characters' NFKD forms, reordered. A short list is chosen only
when every character of the key lies in its blocks, so it is enough that, for every
character of those blocks, the short list translates the character's NFKD form as the
whole list does. A key of that character and a "pilot" that this list covers and no
earlier one does takes that list, and under the C collation lower() leaves non-ASCII
alone, so an entry left untranslated shows as a missing letter. The list that skips NFKD
covers only characters that are their own NFKD form and combine with nothing, so a key
of them is its own NFKD form. The last two branches are the whole list, or no entry of
it at all in the NFKD form."""

from __future__ import annotations

import os
import re
import unicodedata

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

# The confusables are the point of this file.
# ruff: noqa: RUF001

# keel.fold_key as it was before the short lists (functions/fold_key.sql), verbatim but
# for its name and comments.
REFERENCE = """
create function pg_temp.fold_key_reference(p_key text)
returns text
language sql
immutable
parallel safe
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
"""


def _reference_map() -> tuple[str, str]:
    """The reference's 523 confusables and the letters they become."""
    literals = re.findall(r"'([^']*)'", REFERENCE.split("'NFKD'),", 1)[1])
    end = literals.index("[^a-z0-9]+")
    source = "".join(x for x in literals[:end] if not re.fullmatch(r"[a-z0-9]+", x))
    target = "".join(x for x in literals[:end] if re.fullmatch(r"[a-z0-9]+", x))
    assert len(source) == len(set(source)) == len(target) == 523
    return source, target


CONFUSABLES, LETTERS = _reference_map()
ALL_CODE_POINTS = "generate_series(1, 1114111) as c (cp) where c.cp not between 55296 and 57343"

# Keys whose fold the reference and the new function disagree on, under the C collation
# (lower() changes a-z only: a confusable left untranslated is dropped, not lowered).
DIFFERENT = """
select k, keel.fold_key(k), pg_temp.fold_key_reference(k)
from unnest(%s::text[]) as u (k)
where keel.fold_key(k collate "C") is distinct from pg_temp.fold_key_reference(k collate "C")
limit 5
"""


def connect_with_reference(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(REFERENCE)
    return conn


def different(conn: psycopg.Connection, keys: list[str]) -> list[tuple[str, str, str]]:
    return conn.execute(DIFFERENT, (keys,)).fetchall()


def test_fold_key_matches_the_reference_on_every_code_point(migrated_db):
    with connect_with_reference(migrated_db) as conn:
        rows = conn.execute(
            'select c.cp, keel.fold_key(chr(c.cp) collate "C"),'
            ' pg_temp.fold_key_reference(chr(c.cp) collate "C")'
            f" from {ALL_CODE_POINTS}"
            ' and keel.fold_key(chr(c.cp) collate "C")'
            ' is distinct from pg_temp.fold_key_reference(chr(c.cp) collate "C")'
            " limit 5"
        ).fetchall()
    assert rows == []


def test_fold_key_matches_the_reference_under_every_short_list(migrated_db):
    """Each `p_key ~ '^[...]*$'` branch, found in the installed function, is taken by every
    character it covers, each paired (before and after) with the first non-ASCII code
    point that this branch covers and none before it. A branch that translates the key
    without NFKD covers only characters that are their own NFKD form and combine with
    nothing (so no reordering either)."""
    with connect_with_reference(migrated_db) as conn:
        row = conn.execute(
            "select pg_get_functiondef('keel.fold_key(text)'::regprocedure)"
        ).fetchone()
        assert row is not None
        branches = re.findall(r"p_key ~ '([^']*)'::text\) THEN translate\(\"?(\w+)", row[0])
        gates = [pattern for pattern, _ in branches]
        assert len(gates) == len(re.findall(r"p_key ~ '", row[0]))
        assert len(gates) >= 2, "the short lists are gone: fold_key changed shape"
        for gate in gates:
            assert re.fullmatch(r"\^\[[^\]]*\]\*\$", gate), gate  # a set of characters
        covered = conn.execute(
            "select c.cp, array_agg(g.n order by g.n),"
            " normalize(chr(c.cp), NFKD) = chr(c.cp)"
            " from unnest(%s::text[]) with ordinality as g (pattern, n)"
            f" cross join {ALL_CODE_POINTS} and chr(c.cp) ~ g.pattern"
            " group by c.cp",
            (gates,),
        ).fetchall()
        keys: list[str] = []
        for n, (gate, argument) in enumerate(branches, start=1):
            members = [chr(cp) for cp, covering, _ in covered if n in covering]
            pilots = [chr(cp) for cp, covering, _ in covered if covering[0] == n and cp > 127]
            assert pilots, f"no key takes branch {n} ({gate})"
            assert len(members) > 100
            keys += [c + pilots[0] for c in members] + [pilots[0] + c for c in members]
            if argument == "p_key":  # no NFKD
                changed = [
                    hex(cp)
                    for cp, covering, own in covered
                    if n in covering and (not own or unicodedata.combining(chr(cp)))
                ]
                assert changed == [], f"branch {n} skips NFKD for characters it changes"
            else:
                assert argument == "normalize", argument
        assert "p_key" in [argument for _, argument in branches]
        assert different(conn, keys) == []


def _case_forms(c: str) -> set[str]:
    return {c, c.upper(), c.lower(), c.title(), c.casefold(), c.swapcase()}


def test_fold_key_matches_the_reference_on_the_confusables_and_their_case_forms(migrated_db):
    forms = sorted(set().union(*(_case_forms(c) for c in CONFUSABLES)))
    assert len(forms) > 523
    with connect_with_reference(migrated_db) as conn:
        icu = conn.execute(
            "select exists (select from pg_collation where collname = 'und-x-icu')"
        ).fetchone()
        if icu is not None and icu[0]:  # the database's own case forms, too
            rows = conn.execute(
                'select upper(c collate "und-x-icu"), lower(c collate "und-x-icu")'
                " from unnest(%s::text[]) as u (c)",
                (list(CONFUSABLES),),
            ).fetchall()
            forms = sorted(set(forms).union(*rows))
        keys = [
            *forms,
            *(f"x{c}1" for c in forms),
            *(f"pa{c}ss_{c}{c}" for c in forms),
            "".join(forms),
            CONFUSABLES,
            CONFUSABLES.upper(),
            CONFUSABLES.lower(),
            "_".join(CONFUSABLES),
        ]
        assert different(conn, keys) == []
        # each confusable still becomes its letter, whichever branch it takes
        row = conn.execute(
            'select array_agg(keel.fold_key(c collate "C") order by n)'
            " from unnest(%s::text[]) with ordinality as u (c, n)",
            (list(CONFUSABLES),),
        ).fetchone()
        assert row is not None
        assert "".join(row[0]) == LETTERS


# Compatibility decomposition: fullwidth, ligatures, mathematical and enclosed letters,
# accents, Hangul, Kelvin and Angstrom signs, the micro sign (NFKD: Greek mu).
COMPATIBILITY = [
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",  # fullwidth "password"
    "\uff30\uff21\uff33\uff33-\u0430\u043f\u0438\u043a\u043b\u044e\u0447",
    "\ufb01le_\ufb00set_\ufb03x_\ufb06",  # fi, ff, ffi, st ligatures
    "\u01c4\u01c5\u01c6\u01c7\u01c9\u01ca\u01cc\u0132\u0133\u0149\u017f",
    "\U0001d42d\U0001d428\U0001d424\U0001d41e\U0001d427",  # mathematical bold "token"
    "\U0001d531\U0001d52c\U0001d528\U0001d522\U0001d52b",  # fraktur
    "\u24e3\u24de\u24da\u24d4\u24dd\u2460\u2473",  # circled
    "P\u00e0ss-W\u00f6rd",
    "P\u0430ss-W\u00f6rd",  # Cyrillic a
    "pa\u0308sswo\u0301rd\u0327",
    "\u00c5ngstr\u00f6m_\u212b_\u212a_\u2126",
    "\u00b5s_\u00b5\u0430",  # the micro sign (NFKD: Greek mu), with Cyrillic
    "\u00b5\u03bb_\u3395",  # and with Greek
    "\u00bd\u00b2\u00b3\u00b9\u00aa\u00ba\u2070\u2074",
    "\u2160\u2161\u216b\u2170\u217f",  # Roman numerals
    "\u1e9b\u1e9e\u00df\u00e6\u00f8\u0142\u0111",
    "\u0131\u0130stanbul_\u011f\u015f",
    "\u0439\u0451\u0457\u045e\u0453\u045c\u045d\u0419\u0401\u0407",  # NFKD: two characters
    "\u03ac\u03ad\u03ae\u03af\u03cc\u03cd\u03ce\u0390\u03b0\u1f00\u1f71\u1fbe\u03d0\u03f4\u03f9",
    "\u01a1\u01b0\u1edd\u1eef_ng\u01b0\u1eddi",  # Vietnamese
    "\ud55c\uad6d\uc5b4_\u1100\u1161\u3131",  # Hangul, Jamo
    "\u30ad\u30fc_\uff76\uff9e_\u30ac",  # katakana, halfwidth
    "\u0628\u0627\u0633\u0648\u0631\u062f_\u06f1\u06f5\u06f7",  # Arabic, Persian digits
    "\u05e1\u05d9\u05e1\u05de\u05d4",
    "\u0926\u093e\u0935\u0966",  # Devanagari, its digit zero
    "\u0562\u0561\u0576\u0561\u056c\u056b",  # Armenian
    "\u13a0\u13a1\u13a2\u13a5",  # Cherokee
    "\u043a\u043b\u044e\u0447\u03bb\u0561",  # three scripts
    "\u2028\u00a0\u3000\u200b\u200d\ufeff",
]


def test_fold_key_matches_the_reference_on_compatibility_forms(migrated_db):
    keys = [*COMPATIBILITY, *(k.upper() for k in COMPATIBILITY), *(k * 20 for k in COMPATIBILITY)]
    keys += [unicodedata.normalize("NFKD", k) for k in keys]
    keys += [unicodedata.normalize("NFC", k) for k in keys]
    with connect_with_reference(migrated_db) as conn:
        assert different(conn, keys) == []
        row = conn.execute(
            "select keel.fold_key(%s), keel.fold_key(%s), keel.fold_key(%s)",
            (COMPATIBILITY[0], COMPATIBILITY[8], COMPATIBILITY[2]),
        ).fetchone()
        assert row == ("password", "password", "fileffsetffixst")


# Random keys: characters near the short lists' blocks, the confusables, combining marks
# and any code point (no NUL, no surrogate: text holds neither).
_characters = st.one_of(
    st.sampled_from(CONFUSABLES),
    st.characters(min_codepoint=0x80, max_codepoint=0x2000, exclude_categories=["Cs"]),
    st.characters(min_codepoint=0x300, max_codepoint=0x36F),
    st.characters(min_codepoint=0xFF00, max_codepoint=0xFFEF),
    st.characters(min_codepoint=1, exclude_categories=["Cs"]),
    st.sampled_from("aZ09_-. "),
)
_keys = st.text(_characters, min_size=1, max_size=16).filter(lambda k: not k.isascii())


def test_fold_key_matches_the_reference_on_random_keys(migrated_db):
    with connect_with_reference(migrated_db) as conn:
        icu = conn.execute(
            "select exists (select from pg_collation where collname = 'und-x-icu')"
        ).fetchone()

        @settings(
            max_examples=300,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,
            print_blob=True,
        )
        @given(st.lists(_keys, min_size=1, max_size=50))
        def check(keys: list[str]) -> None:
            assert different(conn, keys) == []
            if icu is not None and icu[0]:  # and under a collation that lowers everything
                rows = conn.execute(
                    "select k from unnest(%s::text[]) as u (k)"
                    ' where keel.fold_key(k collate "und-x-icu")'
                    ' is distinct from pg_temp.fold_key_reference(k collate "und-x-icu")',
                    (keys,),
                ).fetchall()
                assert rows == []

        check()
