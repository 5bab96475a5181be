"""keel.fold_keys (and keel.fold_key, which folds one key with it) return exactly what
keel.fold_key returned with the single 523-entry translate. That function, verbatim, is the
reference here, created under pg_temp, and both are compared with it on every code point
(all of them in one call, and each under the branch it takes alone), every code point
under every short list, the confusables and their case forms, compatibility forms, and
random lists of random keys; every code point, NEIGHBOURS and random lists again in
databases whose default collation is an ICU locale whose lower() looks at neighbouring
characters (a SQL-standard function body lowers with the database's default collation,
whatever the caller's); and keel.check_payload's verdict and the path it names with what
it did before keel.fold_keys.

Why this proves them equal on every list of keys: a key of ASCII characters only is folded
on its own, as before. The others are joined by U+0001 (U+0002 where a key holds it) and
folded together; translate() and the map map each character on its own, NFKD never
reorders across U+0001 (a starter), and no lower() looks past it (neither cased nor
case-ignorable): the random lists and NEIGHBOURS check all three with keys that end and
begin with what a neighbour would change. A short list is chosen only when every character
of the joined text lies in its blocks, so it is enough that, for every character of those
blocks, the short list translates the character's NFKD form as the whole list does. A list
of keys holding that character and a "pilot" that this list covers and no earlier one
does takes that list, and lower() leaves an untranslated confusable outside a-z, so an
entry left untranslated shows as a missing letter. The list that skips NFKD covers only
characters that are their own NFKD form and combine with nothing, so a text of them is its
own NFKD form. The last two branches are the whole map, one character at a time, or no
entry of it at all in the NFKD form: every code point takes each of them, alone and
together. The whole map folds each character on its own too (lower case, a-z and 0-9
only) unless the collation lowers I to a dotless i: that rests on no non-ASCII character
of an NFKD form lowering to a letter or digit, checked on every code point under every
collation at hand, and on the Turkish database taking the other way."""

from __future__ import annotations

import json
import os
import re
import unicodedata
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import conninfo, sql

from agentkeel.migrate import migrate_up
from agentkeel.sql_files import sql_root

# The confusables are the point of this file.
# ruff: noqa: RUF001

# keel.fold_key as it was before the short lists and keel.fold_keys (functions/fold_key.sql),
# verbatim but for its name and comments.
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

# Keys whose fold the reference and keel.fold_key, or keel.fold_keys given all of them at
# once, disagree on. All three are SQL-standard function bodies, which take the database's
# default collation whatever the caller's (as keel.fold_key always did): collations are
# tested with databases of their own (test_fold_keys_matches_the_reference_under_icu).
DIFFERENT = """
select u.k, keel.fold_key(u.k), pg_temp.fold_key_reference(u.k)
from unnest(%(keys)s::text[]) as u (k)
where keel.fold_key(u.k) is distinct from pg_temp.fold_key_reference(u.k)
union all
select f.key, f.folded, pg_temp.fold_key_reference(f.key)
from keel.fold_keys(%(keys)s::text[]) as f
where f.folded is distinct from pg_temp.fold_key_reference(f.key)
limit 5
"""

# keel.fold_keys returns each key of its argument once, duplicates and nulls too.
SAME_KEYS = """
select
    (select array_agg(u.k order by u.k) from unnest(%(keys)s::text[]) as u (k))
    is not distinct from (select array_agg(f.key order by f.key) from keel.fold_keys(%(keys)s) as f)
"""


def connect_with_reference(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(REFERENCE)
    return conn


def different(conn: psycopg.Connection, keys: list[str]) -> list[tuple[str, str, str]]:
    rows = conn.execute(DIFFERENT, {"keys": keys}).fetchall()
    same = conn.execute(SAME_KEYS, {"keys": keys}).fetchone()
    assert same == (True,), "keel.fold_keys lost or added keys"
    return rows


def different_in_one_call(conn: psycopg.Connection, keys: list[str]) -> list[tuple[str, str, str]]:
    """Only keel.fold_keys on all the keys at once: for lists too long to fold one by one."""
    return conn.execute(
        "select f.key, f.folded, pg_temp.fold_key_reference(f.key)"
        " from keel.fold_keys(%s::text[]) as f"
        " where f.folded is distinct from pg_temp.fold_key_reference(f.key)"
        " limit 5",
        (keys,),
    ).fetchall()


def icu_collations(conn: psycopg.Connection) -> list[str]:
    """ICU collations whose lower() differs from the root locale's: Turkish and Lithuanian
    dotted i (they look at the next characters), Greek; and the root locale."""
    rows = conn.execute(
        "select collname from pg_collation"
        " where collname in ('und-x-icu', 'tr-x-icu', 'lt-x-icu', 'el-x-icu') order by 1"
    ).fetchall()
    return [r[0] for r in rows]


def short_lists(conn: psycopg.Connection) -> list[tuple[str, bool]]:
    """Each `joined.text ~ '^[...]*$'` branch of the installed keel.fold_keys: its character
    set, and whether it translates the text as given (no NFKD)."""
    row = conn.execute(
        "select pg_get_functiondef('keel.fold_keys(text[])'::regprocedure)"
    ).fetchone()
    assert row is not None
    branches = re.findall(
        r"WHEN \(joined\.text ~ '([^']*)'::text\) THEN translate\("
        r"(joined\.text|\( SELECT nfkd\.text)",
        row[0],
    )
    assert len(branches) == len(re.findall(r"joined\.text ~ '", row[0]))
    assert len(branches) >= 2, "the short lists are gone: fold_keys changed shape"
    for gate, _ in branches:
        assert re.fullmatch(r"\^\[[^\]]*\]\*\$", gate), gate  # a set of characters
    return [(gate, argument == "joined.text") for gate, argument in branches]


def covering(conn: psycopg.Connection, gates: list[str]) -> dict[int, list[int]]:
    """The code points some short list covers: the lists (1-based, in order) that do."""
    rows = conn.execute(
        "select c.cp, array_agg(g.n order by g.n)"
        " from unnest(%s::text[]) with ordinality as g (pattern, n)"
        f" cross join {ALL_CODE_POINTS} and chr(c.cp) ~ g.pattern"
        " group by c.cp",
        (gates,),
    ).fetchall()
    return {cp: lists for cp, lists in rows}


def takes(conn: psycopg.Connection, gates: list[str], keys: list[str]) -> str:
    """The branch keel.fold_keys takes for these keys: the first short list covering the
    joined text of those that are not ASCII only, else "no entry" or "map"."""
    row = conn.execute(
        "select array_to_string(array(select replace(k, e'\\u0001', e'\\u0002')"
        " from unnest(%s::text[]) as k where octet_length(k) != char_length(k)), e'\\u0001')",
        (keys,),
    ).fetchone()
    assert row is not None
    joined = row[0]
    for n, gate in enumerate(gates, start=1):
        hit = conn.execute("select %s::text ~ %s", (joined, gate)).fetchone()
        if hit is not None and hit[0]:
            return f"short list {n}"
    entry = conn.execute(
        "select normalize(%s::text, NFKD) ~ %s", (joined, "[" + CONFUSABLES + "]")
    ).fetchone()
    return "map" if entry is not None and entry[0] else "no entry"


def test_fold_keys_matches_the_reference_on_every_code_point(migrated_db):
    """Every code point as a key: all of them in one call (the whole map, one character at
    a time), and each in a call with the others that take, alone, the branch it takes
    alone (a short list, no entry, or the whole map)."""
    everything = [chr(cp) for cp in range(1, 0x110000) if not 0xD800 <= cp <= 0xDFFF]
    with connect_with_reference(migrated_db) as conn:
        gates = [gate for gate, _ in short_lists(conn)]
        assert takes(conn, gates, everything) == "map"
        assert different_in_one_call(conn, everything) == []
        first = {cp: lists[0] for cp, lists in covering(conn, gates).items()}
        alone: dict[str, list[str]] = {}
        rows = conn.execute(
            f"select c.cp, normalize(chr(c.cp), NFKD) ~ %s from {ALL_CODE_POINTS} and c.cp > 127",
            ("[" + CONFUSABLES + "]",),
        ).fetchall()
        for cp, entry in rows:
            branch = f"short list {first[cp]}" if cp in first else ("map" if entry else "no entry")
            alone.setdefault(branch, []).append(chr(cp))
        assert set(alone) == {f"short list {n}" for n in range(1, len(gates) + 1)} | {
            "map",
            "no entry",
        }
        for branch, keys in alone.items():
            assert takes(conn, gates, keys) == branch
            assert different_in_one_call(conn, keys) == [], branch
        # and keel.fold_key, one key at a time, on a sample of them all
        sample = [*everything[::97], *CONFUSABLES]
        assert different(conn, sample) == []


def test_no_non_ascii_character_of_an_nfkd_form_lowers_to_a_letter_or_digit(migrated_db):
    """What lets keel.fold_keys fold each character on its own where the collation lowers
    A-Z to a-z: under the database's collation and every ICU one at hand, no non-ASCII
    code point that is its own NFKD form lowers to anything holding a-z or 0-9."""
    with connect_with_reference(migrated_db) as conn:
        for collation in ["default", "C", *icu_collations(conn)]:
            rows = conn.execute(
                f"select c.cp from {ALL_CODE_POINTS} and c.cp > 127"
                " and normalize(chr(c.cp), NFKD) = chr(c.cp)"
                f" and lower(chr(c.cp) collate \"{collation}\") ~ '[a-z0-9]' limit 5"
            ).fetchall()
            assert rows == [], collation


def test_fold_keys_matches_the_reference_under_every_short_list(migrated_db):
    """Each `joined.text ~ '^[...]*$'` branch, found in the installed function, is taken by
    every character it covers, each paired (before and after, in one key) with the first
    non-ASCII code point that this branch covers and none before it, all the pairs in one
    call; and one pair at a time through keel.fold_key. A branch that translates the text
    without NFKD covers only characters that are their own NFKD form and combine with
    nothing (so no reordering either)."""
    with connect_with_reference(migrated_db) as conn:
        branches = short_lists(conn)
        gates = [gate for gate, _ in branches]
        lists = covering(conn, gates)
        assert any(as_given for _, as_given in branches)
        for n, (gate, as_given) in enumerate(branches, start=1):
            members = [chr(cp) for cp, covers in lists.items() if n in covers]
            pilots = [chr(cp) for cp, covers in lists.items() if covers[0] == n and cp > 127]
            assert pilots, f"no key takes branch {n} ({gate})"
            assert len(members) > 100
            keys = [c + pilots[0] for c in members] + [pilots[0] + c for c in members]
            assert takes(conn, gates, keys) == f"short list {n}"
            assert different_in_one_call(conn, keys) == [], gate
            assert different(conn, keys) == [], gate
            if as_given:  # no NFKD
                changed = [
                    hex(ord(c))
                    for c in members
                    if unicodedata.normalize("NFKD", c) != c or unicodedata.combining(c)
                ]
                assert changed == [], f"branch {n} skips NFKD for characters it changes"


def _case_forms(c: str) -> set[str]:
    return {c, c.upper(), c.lower(), c.title(), c.casefold(), c.swapcase()}


def test_fold_key_matches_the_reference_on_the_confusables_and_their_case_forms(migrated_db):
    forms = sorted(set().union(*(_case_forms(c) for c in CONFUSABLES)))
    assert len(forms) > 523
    with connect_with_reference(migrated_db) as conn:
        if "und-x-icu" in icu_collations(conn):  # the database's own case forms, too
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
        # each confusable still becomes its letter, alone and all together
        row = conn.execute(
            'select array_agg(keel.fold_key(c collate "C") order by n)'
            " from unnest(%s::text[]) with ordinality as u (c, n)",
            (list(CONFUSABLES),),
        ).fetchone()
        assert row is not None
        assert "".join(row[0]) == LETTERS
        rows = conn.execute(
            "select f.key, f.folded from keel.fold_keys(%s::text[]) as f", (list(CONFUSABLES),)
        ).fetchall()
        assert dict(rows) == dict(zip(CONFUSABLES, LETTERS, strict=True))


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


def test_fold_keys_takes_any_list(migrated_db):
    """No keys, a null list, null and empty keys, duplicates, keys that hold the separator
    U+0001 (or U+0002, what it is written as), a single key that folds to nothing, and the
    same keys in another order."""
    lists = [
        [],
        [None],
        ["", None, "", "a"],
        ["\u0001", "a\u0001b", "\u0001\u0430\u0001", "\u0002\u0430", "\u0430\u0001", "\u0001"],
        ["\u4e2d"],
        ["\u0561"],
        ["\u0430"],
        ["\u4e2d", "\u4e2d", "-"],
        ["P\u0430ss", "P\u0430ss", "\u0561\u0531", "key", "\u13a0\u0561"],
    ]
    with connect_with_reference(migrated_db) as conn:
        for keys in lists:
            assert different(conn, keys) == [], keys
            assert different(conn, keys[::-1]) == [], keys
        row = conn.execute("select count(*) from keel.fold_keys(null)").fetchone()
        assert row == (0,)
        row = conn.execute(
            "select keel.fold_key(null), keel.fold_key(''), keel.fold_key('\u4e2d')"
        ).fetchone()
        assert row == (None, "", "")


# Random keys: characters near the short lists' blocks, the confusables, combining marks
# and any code point (no NUL, no surrogate: text holds neither); and at either end of a
# key, what a neighbouring key's characters would change if the fold saw past the
# separator: combining marks (NFKD reorders them), dotted and dotless i, I, J, and the
# Lithuanian and Turkish dots (ICU lower() looks at them), sigma, U+0001 and U+0002.
_characters = st.one_of(
    st.sampled_from(CONFUSABLES),
    st.characters(min_codepoint=0x80, max_codepoint=0x2000, exclude_categories=["Cs"]),
    st.characters(min_codepoint=0x300, max_codepoint=0x36F),
    st.characters(min_codepoint=0xFF00, max_codepoint=0xFFEF),
    st.characters(min_codepoint=1, exclude_categories=["Cs"]),
    st.sampled_from("aZ09_-. "),
)
_edges = st.text(
    st.one_of(
        st.sampled_from(
            "IiJj\u0130\u0131\u0307\u0301\u0300\u0303\u0323\u03a3\u03c3\u03c2\u0001\u0002"
        ),
        st.characters(min_codepoint=0x300, max_codepoint=0x36F),
    ),
    max_size=3,
)
_keys = st.builds(
    lambda head, middle, tail: head + middle + tail,
    _edges,
    st.text(_characters, min_size=1, max_size=16),
    _edges,
)


def test_fold_keys_matches_the_reference_on_random_keys(migrated_db):
    with connect_with_reference(migrated_db) as conn:

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

        check()


@pytest.fixture
def icu_database(admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database whose default collation is the ICU locale request.param, so
    that the reference and keel.fold_keys both lower with it (dropped afterwards)."""
    name = f"agentkeel_test_icu_{request.param}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        try:
            admin.execute(
                sql.SQL(
                    "create database {} template template0 locale_provider icu icu_locale {}"
                ).format(sql.Identifier(name), sql.Literal(request.param))
            )
        except psycopg.Error as error:
            pytest.skip(f"no database with an ICU default collation here: {error}")
    try:
        dsn = conninfo.make_conninfo(admin_dsn, dbname=name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate_up(conn, sql_root())
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
            )


# Keys that put side by side, in the joined text, what ICU's lower() looks at: I, J or i
# before a combining dot above or another mark (Turkish, Lithuanian), sigma, U+0001.
NEIGHBOURS = [
    "\u0391I",
    "\u0307x",
    "\u0391I\u0323",
    "\u0307\u0561",
    "I\u0561",
    "I\u0307\u0561",
    "\u0130\u0561",
    "\u0561I",
    "\u0301\u0307",
    "J\u0561\u0301",
    "\u0128\u0561",
    "\u0131\u0307\u0561",
    "a\u03a3",
    "\u03a3a",
    "\u0561\u0001I",
    "\u0307\u0001",
    "IiJj\u0561\u0130\u0131\u012e",
]


@pytest.mark.parametrize("icu_database", ["und", "tr", "lt", "el"], indirect=True)
def test_fold_keys_matches_the_reference_under_icu(icu_database):
    """In a database whose default collation is an ICU locale (the root; Turkish, where I
    lowers to a dotless i but to i before a combining dot above, so keel.fold_keys cannot
    fold one character at a time; Lithuanian, which adds dots after i and j; Greek): every
    code point in one call, keys whose neighbours matter, and random lists of keys."""
    with connect_with_reference(icu_database) as conn:
        row = conn.execute("select lower('I\u0130')").fetchone()
        assert row is not None and row[0][0] == ("\u0131" if "_tr_" in icu_database else "i")
        everything = [chr(cp) for cp in range(1, 0x110000) if not 0xD800 <= cp <= 0xDFFF]
        assert different_in_one_call(conn, everything) == []
        pairs = [a + b for a in NEIGHBOURS for b in NEIGHBOURS]
        assert different(conn, [*NEIGHBOURS, *pairs]) == []

        @settings(
            max_examples=100,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,
            print_blob=True,
        )
        @given(st.lists(_keys, min_size=1, max_size=50))
        def check(keys: list[str]) -> None:
            assert different(conn, keys) == []

        check()


# keel.check_payload's redaction as it was before keel.fold_keys: every key (at any depth,
# with its path) folded on its own, matched against each rule with =, strpos and right(),
# the first matching path in path order.
FIRST_SECRET_PATH = """
with recursive walk (path, key, value) as (
    select '$'::text, null::text, %s::jsonb
    union all
    select child.path, child.key, child.value
    from walk as w
    cross join lateral (
        select left(w.path || '.' || o.key, 200), o.key, o.value
        from jsonb_each(
            case when jsonb_typeof(w.value) = 'object' then w.value else '{}'::jsonb end
        ) as o (key, value)
        union all
        select left(w.path || '[' || (a.idx - 1) || ']', 200), null::text, a.value
        from jsonb_array_elements(
            case when jsonb_typeof(w.value) = 'array' then w.value else '[]'::jsonb end
        ) with ordinality as a (value, idx)
    ) as child (path, key, value)
),

keys as materialized (
    select w.path, pg_temp.fold_key_reference(w.key) as folded
    from walk as w
    where w.key is not null
)

select k.path
from keys as k
inner join keel.redaction_rules as r
    on (r.match = 'exact' and k.folded = r.pattern)
    or (r.match = 'contains' and strpos(k.folded, r.pattern) > 0)
    or (r.match = 'suffix' and right(k.folded, char_length(r.pattern)) = r.pattern)
order by k.path
limit 1
"""


def _disguises(letter: str) -> list[str]:
    """Characters that fold to this letter: itself, upper case, its confusables."""
    return [
        letter,
        letter.upper(),
        *(c for c, t in zip(CONFUSABLES, LETTERS, strict=True) if t == letter),
    ]


# Keys that may fold to a rule's pattern (a deny-listed word, disguised letter by letter,
# with separators, before or after other text), and random keys.
_words = ["password", "token", "secret", "apikey", "pin", "otp", "prompt", "messages", "ssn", "cvv"]
_secret_keys = st.builds(
    lambda head, letters, tail: head + "".join(letters) + tail,
    st.sampled_from(["", "x", "my_", "Max", "_", "\u0561"]),
    st.sampled_from(_words).flatmap(
        lambda word: st.tuples(
            *(
                st.tuples(st.sampled_from(_disguises(ch)), st.sampled_from(["", "", "_", "-"])).map(
                    "".join
                )
                for ch in word
            )
        )
    ),
    st.sampled_from(["", "s", "_id", "Code", "\u13a0", "1"]),
)


def _payload(keys: list[str]) -> str:
    """The keys in an object, half of them again in an array of objects under it."""
    inner = [{k: i} for i, k in enumerate(keys[::2])]
    return json.dumps({**{k: i for i, k in enumerate(keys)}, "nested": inner}, ensure_ascii=False)


def _verdict(conn: psycopg.Connection, payload: str) -> str | None:
    """The path keel.check_payload names, or None when it accepts the payload."""
    try:
        conn.execute(
            "select keel.check_payload('p', %s::jsonb, 'max_event_payload_bytes')", (payload,)
        )
    except psycopg.Error as error:
        assert error.sqlstate == "22K02", error  # payload_rejected
        found = re.fullmatch(r"p key (.*) may carry a secret", error.diag.message_primary or "")
        assert found is not None, error.diag.message_primary
        return found.group(1)
    return None


def test_check_payload_refuses_what_folding_each_key_alone_refused(migrated_db):
    """keel.check_payload folds a payload's keys with keel.fold_keys and matches them with
    one regular expression: it refuses exactly the payloads that folding each key with the
    reference and matching each rule refused, and names the same first path."""
    with connect_with_reference(migrated_db) as conn:

        @settings(
            max_examples=200,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,
            print_blob=True,
        )
        @given(st.lists(st.one_of(_keys, _secret_keys), min_size=1, max_size=30))
        def check(keys: list[str]) -> None:
            payload = _payload(keys)
            row = conn.execute(FIRST_SECRET_PATH, (payload,)).fetchone()
            assert _verdict(conn, payload) == (row[0] if row else None)

        check()


@pytest.fixture
def large_payloads() -> Iterator[list[str]]:
    """About 64 KiB of keys that no short list covers, a disguised secret among them."""
    keys = ["\u0563\u0561\u0572" + str(i) + CONFUSABLES[i % 523] for i in range(1900)]
    yield [
        _payload(keys),
        _payload([*keys[:950], "\u0440\u0430\u0455\u0455w\u03bfrd", *keys[950:]]),
    ]


def test_check_payload_on_a_large_payload_of_mixed_keys(migrated_db, large_payloads):
    with connect_with_reference(migrated_db) as conn:
        for payload in large_payloads:
            assert len(payload.encode()) <= 65_536
            row = conn.execute(FIRST_SECRET_PATH, (payload,)).fetchone()
            assert _verdict(conn, payload) == (row[0] if row else None)
        found = _verdict(conn, large_payloads[1])
        assert found is not None and found.endswith(".\u0440\u0430\u0455\u0455w\u03bfrd")


def test_check_payload_with_each_kind_of_rule_alone_and_none(migrated_db):
    """The regular expression keel.check_payload builds from keel.redaction_rules, with only
    exact, only contains, only suffix rules, or none at all (then nothing is refused, not
    even a key that folds to nothing)."""
    keys = [
        "",
        "-",
        "\u4e2d",
        "pin",
        "PIN_code",
        "x_t\u043eken",
        "tokens",
        "my_pa\u0455\u0455word",
        "system_prompt",
        "\u0561\u0531",
    ]
    payload = _payload(keys)
    with connect_with_reference(migrated_db) as conn:
        for kept in (["exact"], ["contains"], ["suffix"], []):
            with conn.transaction(force_rollback=True):
                conn.execute("delete from keel.redaction_rules where match != all(%s)", (kept,))
                row = conn.execute(FIRST_SECRET_PATH, (payload,)).fetchone()
                expected = row[0] if row else None
                assert (expected is None) == (not kept), kept
                assert _verdict(conn, payload) == expected, kept
