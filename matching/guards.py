"""Cheap lexical checks that catch near-miss traps: two prompts that embed close but ask different things.

Each guard compares the cached prompt with the request and returns a reason when it fires (None when it
does not). They are deliberately word-list based and general English: a fired guard means "do not trust
the similarity", not "the answers differ". What each guard looks for, and which bench run each round of
words came from: docs/tiers.md ("The match guards").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import TypeVar

_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*|\d+(?:[.,:/]\d+)*")
_SENTENCE_END = re.compile(r"[.!?;:]\s+|\n")
_T = TypeVar("_T")
# The analyses of one text below are pure and memoised: a cached prompt is compared with many
# requests, and one request with several candidates (the same text was parsed for each pair, up to
# a fifth of a text lookup's CPU on the event loop). What they return is immutable, or treated so.
# Texts up to _MEMO_CHARS are remembered, _MEMO_TEXTS of them per analysis (a few MB at most).
_MEMO_TEXTS = 2048
_MEMO_CHARS = 512


def _memo(analyse: Callable[[str], _T]) -> Callable[[str], _T]:
    remembered = lru_cache(maxsize=_MEMO_TEXTS)(analyse)

    @wraps(analyse)
    def call(text: str) -> _T:
        return remembered(text) if len(text) <= _MEMO_CHARS else analyse(text)

    return call


@_memo
def _words(text: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(text.replace("\u2019", "'")))


# --- negation -----------------------------------------------------------------------------------------

NEGATORS = frozenset(
    {"not", "no", "never", "without", "none", "nobody", "nothing", "nowhere", "neither", "nor", "cannot"}
)
# Words that negate without a "not": "in the absence of", "avoid", "zero-copy" ~ "without copying".
IMPLICIT_NEGATORS = frozenset(
    "absence absent lack lacks lacking avoid avoids avoiding prevent prevents preventing zero unable "
    "refuse refuses".split()
)
_NOT_ONLY = re.compile(r"\bnot\s+only\b", re.IGNORECASE)
# Prefixes that negate the base word: safe/unsafe, possible/impossible, agree/disagree.
_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non")


_ANSWER_PARTICLE = re.compile(r"(^|[.!?]\s+)(no|yes)\s*[,.!]", re.IGNORECASE)


@_memo
def _negations(text: str) -> int:
    """Negating words, "n't", and "no-"/"non-" compounds; a leading "No," answers, it does not negate,
    and "neither ... nor" negates once."""
    words = _words(_NOT_ONLY.sub(" ", _ANSWER_PARTICLE.sub(r"\1", text)))
    return sum(
        1
        for w in words
        if (w in NEGATORS and w != "nor")
        or w in IMPLICIT_NEGATORS
        or w.endswith("n't")
        or w.startswith(("no-", "non-", "zero-"))
    )


def negation(cached: str, request: str) -> str | None:
    """A negation added or removed (explicit or implicit), or a word swapped for its negated form."""
    a, b = _words(cached), _words(request)
    na, nb = _negations(cached), _negations(request)
    if na != nb:
        return f"negation {'added' if nb > na else 'removed'}"
    sa, sb = set(a), set(b)
    for only, other in ((sa - sb, sb - sa), (sb - sa, sa - sb)):
        for word in only:
            if "-" in word or not word.startswith(_PREFIXES):
                continue  # "non-streaming" was counted as a negation above
            for prefix in _PREFIXES:
                if word.startswith(prefix):
                    base = word[len(prefix) :]
                    if len(base) >= 4 and base in other:
                        return f"negated form: {base!r} vs {word!r}"
    return None


# --- numbers, dates, units ----------------------------------------------------------------------------

_NUMBER_WORDS = {
    "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
    "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19",
    "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000",
    "million": "1000000", "billion": "1000000000",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th",
}  # fmt: skip
UNITS = {
    "mm": "mm", "cm": "cm", "m": "m", "km": "km", "mile": "mile", "miles": "mile", "inch": "inch",
    "inches": "inch", "ft": "ft", "foot": "ft", "feet": "ft", "g": "g", "kg": "kg", "lb": "lb",
    "lbs": "lb", "oz": "oz", "ml": "ml", "l": "l", "litre": "l", "litres": "l", "liter": "l",
    "liters": "l", "gallon": "gallon", "gallons": "gallon", "mg": "mg", "mph": "mph", "kmh": "kmh",
    "gb": "gb", "mb": "mb", "tb": "tb", "kb": "kb", "ghz": "ghz", "mhz": "mhz", "w": "w", "kw": "kw",
    "kwh": "kwh", "v": "v", "c": "c", "f": "f", "percent": "%", "%": "%", "pct": "%",
    "second": "s", "seconds": "s", "sec": "s", "secs": "s", "minute": "min", "minutes": "min",
    "min": "min", "mins": "min", "hour": "h", "hours": "h", "hr": "h", "hrs": "h", "h": "h",
    "day": "day", "days": "day", "week": "week", "weeks": "week", "month": "month", "months": "month",
    "year": "year", "years": "year", "yr": "year", "yrs": "year", "am": "am", "pm": "pm",
    "£": "gbp", "$": "usd", "€": "eur", "¥": "jpy", "pound": "gbp", "pounds": "gbp", "dollar": "usd",
    "dollars": "usd", "euro": "eur", "euros": "eur", "p": "p", "pence": "p", "cents": "cent",
}  # fmt: skip
MONTHS = {
    m[:3]: i + 1
    for i, m in enumerate(
        "january february march april may june july august september october november december".split()
    )
}
WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_QUANTITY = re.compile(
    r"([£$€¥])?\s?(\d+(?:[.,:/]\d+)*)(?:\s?(st|nd|rd|th))?[\s\-]?(%|[a-z]+)?", re.IGNORECASE
)


_LIST_MARKER = re.compile(r"(^|\s)\(?\d{1,2}[).]\s")


@_memo
def _quantities(text: str) -> tuple[Counter[str], Counter[str]]:
    """Numbers normalised with their currency or unit, named days and months; (from digits, from words).

    List markers ("1) ... 2) ...") are layout, not quantities."""
    found: Counter[str] = Counter()
    spelled: Counter[str] = Counter()
    low = _LIST_MARKER.sub(" ", text.lower().replace("\u2019", "'").replace("-", " "))
    for m in _QUANTITY.finditer(low):
        currency, number, ordinal, unit = m.groups()
        number = number.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+", number) else number
        tag = UNITS.get(currency or "") or UNITS.get(unit or "", "")
        found[f"{number}{ordinal or ''}{tag}"] += 1
    words = _words(low)
    for i, w in enumerate(words):
        if w in _NUMBER_WORDS:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            spelled[f"{_NUMBER_WORDS[w]}{UNITS.get(nxt, '')}"] += 1
        elif w == "one" and (i + 1 < len(words) and words[i + 1] in UNITS):
            spelled[f"1{UNITS[words[i + 1]]}"] += 1  # "one" alone is mostly a pronoun
        elif w in WEEKDAYS:
            found[w] += 1
        elif len(w) >= 3 and w[:3] in MONTHS and w in _MONTH_NAMES:
            found[f"month{MONTHS[w[:3]]}"] += 1
    return found, spelled


_MONTH_NAMES = frozenset(
    "january february march april june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)  # "may" is left out: it is mostly the verb


def numbers(cached: str, request: str) -> str | None:
    """Numbers, amounts, dates or units that differ (compared as multisets: order does not matter).

    A quantity on one side only fires when it is written in digits or is a day/month: spelled numbers
    and ordinals ("two steps", "first") are too often just style when nothing replaces them."""
    (da, wa), (db, wb) = _quantities(cached), _quantities(request)
    a, b = da + wa, db + wb
    if a == b:
        return None
    only_a, only_b = sorted((a - b).elements()), sorted((b - a).elements())
    if (only_a and only_b) or (da - db) or (db - da):
        return f"numbers changed: {only_a} vs {only_b}"
    return None


# --- named entities and quoted strings ----------------------------------------------------------------

_QUOTED = re.compile(r"(?<![\w])[\"'\u201c\u2018]([^\"'\u201d\u2019]{1,80})[\"'\u201d\u2019](?![\w])")
_NOT_ENTITIES = (
    frozenset("i i'm i've i'd i'll ok okay hi hello hey please thanks yes mr mrs ms dr".split()) | NEGATORS
)


@_memo
def _entities(text: str) -> tuple[str, ...]:
    """Capitalised words that are not sentence openers, acronyms, and quoted strings (lower-cased)."""
    text = text.replace("\u2019", "'")
    found: list[str] = [q.strip().lower() for q in _QUOTED.findall(text)]
    for sentence in _SENTENCE_END.split(text):
        tokens = sentence.split()
        for i, token in enumerate(tokens):
            word = token.strip("\"'()[],.!?;:")
            if not word or not word[0].isupper():
                continue
            # The first word of a sentence is capitalised anyway; keep it only if it is an acronym.
            if i == 0 and not (len(word) > 1 and word.isupper()):
                continue
            if word.lower() in _NOT_ENTITIES or word.lower() in WEEKDAYS or word.lower() in _MONTH_NAMES:
                continue
            found.append(word.lower())
    return tuple(found)


def _initials(text: str) -> str:
    """First letters of the words and of their camel-case parts: "JavaScript machine learning" -> "jsml"."""
    parts = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", text)
    return "".join(p[0] for p in parts).lower()


def _mentions(text: str, entity: str) -> bool:
    """Whether `text` names `entity` in any casing or spacing ("Hugging Face" ~ "huggingface"), as a word
    prefix ("INSTALLATIO" ~ "installation"), or spells out an acronym ("ML" ~ "machine learning")."""
    key = re.sub(r"[^a-z0-9]", "", entity)
    if not key:
        return True
    squashed = re.sub(r"[^a-z0-9]", "", text.lower())
    if len(key) >= 3 and key in squashed:
        return True
    if re.search(rf"\b{re.escape(key)}", text.lower()) or re.search(rf"\b{re.escape(entity)}", text.lower()):
        return True
    return entity.isalpha() and len(entity) <= 5 and key in _initials(text)


_ROLE_WORDS = ("from", "to", "into", "than", "vs", "versus", "over")
_STOP = frozenset(
    "a an the my your our their his her its this that these those of in on at for and or me us".split()
)


@_memo
def _roles(text: str) -> dict[str, frozenset[str]]:
    """What follows each directional word ("from X to Y"), as sets of content words."""
    words = _words(text)
    roles: dict[str, frozenset[str]] = {}
    for i, w in enumerate(words):
        if w not in _ROLE_WORDS or w in roles:
            continue
        phrase: list[str] = []
        for nxt in words[i + 1 : i + 5]:
            if nxt in _ROLE_WORDS or nxt in NEGATORS:
                break
            if nxt not in _STOP:
                phrase.append(nxt)
        if phrase:
            roles[w] = frozenset(phrase)
    return roles


def entities(cached: str, request: str) -> str | None:
    """A named entity or quoted string replaced by another, or two phrases swapped between roles."""
    only_a = sorted({e for e in _entities(cached) if not _mentions(request, e)})
    only_b = sorted({e for e in _entities(request) if not _mentions(cached, e)})
    if only_a and only_b:
        return f"entity changed: {only_a} vs {only_b}"
    ra, rb = _roles(cached), _roles(request)
    for x in ra:
        for y in ra:
            if x < y and x in rb and y in rb and ra[x] == rb[y] and ra[y] == rb[x] and ra[x] != ra[y]:
                return f"swapped: {x} {sorted(ra[x])} / {y} {sorted(ra[y])}"
    pa, pb = _before_to(cached), _before_to(request)
    for w in ("to", "into"):
        if w in ra and w in rb and w in pa and w in pb and ra[w] != rb[w]:
            if ra[w] <= pb[w] and rb[w] <= pa[w]:
                return f"swapped around {w!r}: {sorted(ra[w])} / {sorted(rb[w])}"
    return None


@_memo
def _before_to(text: str) -> dict[str, frozenset[str]]:
    """The content words just before the first "to"/"into" ("convert a PDF to Word": {convert, pdf})."""
    words = _words(text)
    out: dict[str, frozenset[str]] = {}
    for i, w in enumerate(words):
        if w in ("to", "into") and w not in out:
            out[w] = frozenset(x for x in words[max(0, i - 4) : i] if x not in _STOP and x not in _ROLE_WORDS)
    return out


# --- opposite comparatives and antonyms ---------------------------------------------------------------

OPPOSITES: tuple[tuple[str, str], ...] = (
    ("more", "less"), ("more", "fewer"), ("most", "least"), ("higher", "lower"), ("highest", "lowest"),
    ("high", "low"), ("bigger", "smaller"), ("biggest", "smallest"), ("larger", "smaller"),
    ("largest", "smallest"), ("big", "small"), ("large", "small"), ("longer", "shorter"),
    ("longest", "shortest"), ("long", "short"), ("faster", "slower"), ("fastest", "slowest"),
    ("fast", "slow"), ("cheaper", "dearer"), ("cheapest", "dearest"), ("cheap", "expensive"),
    ("better", "worse"), ("best", "worst"), ("good", "bad"), ("older", "newer"), ("oldest", "newest"),
    ("old", "new"), ("before", "after"), ("earlier", "later"), ("earliest", "latest"), ("early", "late"),
    ("first", "last"), ("above", "below"), ("over", "under"), ("max", "min"), ("maximum", "minimum"),
    ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"), ("rise", "fall"),
    ("gain", "lose"), ("add", "remove"), ("include", "exclude"), ("included", "excluded"),
    ("open", "closed"), ("open", "close"), ("start", "stop"), ("start", "end"), ("begin", "end"),
    ("enable", "disable"), ("allow", "forbid"), ("allowed", "forbidden"), ("allowed", "banned"),
    ("accept", "reject"), ("buy", "sell"), ("import", "export"), ("upload", "download"),
    ("inbound", "outbound"), ("arrive", "depart"), ("arrival", "departure"), ("push", "pull"),
    ("input", "output"), ("send", "receive"), ("win", "lose"), ("pass", "fail"), ("true", "false"),
    ("hot", "cold"), ("warm", "cold"), ("safe", "dangerous"), ("legal", "illegal"), ("maximise", "minimise"),
    ("maximize", "minimize"), ("ascending", "descending"), ("north", "south"), ("east", "west"),
    ("left", "right"), ("up", "down"), ("on", "off"), ("in", "out"), ("inside", "outside"),
    ("same", "different"),
    ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "risks"), ("strengths", "weaknesses"), ("plus", "minus"), ("positive", "negative"),
    ("lend", "borrow"), ("give", "take"), ("credit", "debit"), ("deposit", "withdraw"), ("join", "leave"),
    ("weekday", "weekend"), ("part-time", "full-time"), ("within", "after"), ("within", "outside"),
    ("private", "public"), ("internal", "external"), ("domestic", "international"),
    ("temporary", "permanent"), ("online", "offline"), ("manual", "automatic"), ("upgrade", "downgrade"),
    ("encrypt", "decrypt"), ("compress", "decompress"), ("over#n", "under#n"), ("above#n", "below#n"),
    ("optional", "compulsory"), ("optional", "mandatory"), ("optional", "required"),
    ("in#v", "out#v"), ("on#v", "off#v"), ("up#v", "down#v"),
)  # fmt: skip
_OPPOSITE: dict[str, set[str]] = {}
for _x, _y in OPPOSITES:
    _OPPOSITE.setdefault(_x, set()).add(_y)
    _OPPOSITE.setdefault(_y, set()).add(_x)
# Prepositions/particles that are too common to compare without context; only their comparative sense
# ("in" vs "out" of a list) would matter, and paraphrases swap them freely.
_WEAK = frozenset({"in", "out", "on", "off", "up", "down", "over", "under", "left", "right"})


_INFLECTIONS = (("ies", "y"), ("es", ""), ("s", ""), ("ed", ""), ("d", ""), ("ing", ""), ("ing", "e"))
_AMOUNT = re.compile(r"[£$€¥]?\d")
_PHRASAL = frozenset(
    "opt log sign check switch turn scale zoom scroll power plug clock shut back".split()
)  # fmt: skip


def _bases(word: str) -> frozenset[str]:
    """The word and what it may inflect ("increased" -> "increase", "weekends" -> "weekend")."""
    forms = {word}
    for suffix, ending in _INFLECTIONS:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            forms.add(word[: -len(suffix)] + ending)
    return frozenset(forms)


@_memo
def _comparables(text: str) -> dict[str, frozenset[str]]:
    """Words by their base forms; a weak comparative before an amount ("over £50") as "over#n"."""
    words = _words(text)
    out = {w: _bases(w) for w in words}
    for i, w in enumerate(words[:-1]):
        if w in ("over", "under", "above", "below") and _AMOUNT.match(words[i + 1]):
            out[f"{w}#n"] = frozenset({f"{w}#n"})
        # A particle that makes the verb: opt in/out, log in/out, switch on/off, scale up/down.
        if _bases(w) & _PHRASAL and words[i + 1] in ("in", "out", "on", "off", "up", "down"):
            out[f"{words[i + 1]}#v"] = frozenset({f"{words[i + 1]}#v"})
    return out


def opposites(cached: str, request: str) -> str | None:
    """A word in one prompt whose opposite is in the other and not in the first (more/less, before/after;
    inflected forms too: increased/decreased, weekdays/weekends; over/under only before an amount)."""
    ca, cb = _comparables(cached), _comparables(request)
    fa, fb = frozenset().union(*ca.values()), frozenset().union(*cb.values())
    for word in sorted(ca.keys() - cb.keys()):
        if word in _WEAK or ca[word] & fb:
            continue
        for base in sorted(ca[word]):
            for opposite in sorted(_OPPOSITE.get(base, ())):
                if opposite in fb and opposite not in fa and opposite not in _WEAK:
                    return f"opposite: {word!r} vs {opposite!r}"
    return None


# --- instructions --------------------------------------------------------------------------------------

LANGUAGES = frozenset(
    "english french german spanish italian portuguese dutch swedish norwegian danish finnish polish czech "
    "slovak hungarian romanian bulgarian greek turkish russian ukrainian arabic hebrew persian farsi hindi "
    "urdu bengali tamil telugu punjabi chinese mandarin cantonese japanese korean vietnamese thai "
    "indonesian malay filipino tagalog swahili latin catalan basque welsh irish icelandic".split()
)
_FORMATS = {
    "json": "json", "yaml": "yaml", "xml": "xml", "csv": "csv", "html": "html", "markdown": "markdown",
    "table": "table", "list": "list", "bullet": "list", "bullets": "list", "bulleted": "list",
    "numbered": "list", "haiku": "poem", "poem": "poem", "limerick": "poem", "sonnet": "poem",
    "code": "code", "essay": "essay",
    "tweet": "tweet", "email": "email", "letter": "letter", "story": "story", "song": "poem",
}  # fmt: skip
_LENGTH_WORDS = {"briefly": "short", "concisely": "short", "succinctly": "short", "thoroughly": "long"}
_IN_DEPTH = re.compile(r"\bin (?:great |more |full )?(?:detail|depth)\b")
_IN_LANGUAGE = re.compile(r"\b(?:in|into)\s+([a-z]+)\b")
_AS_FORMAT = re.compile(r"\b(?:in|as|into)\s+(?:an?\s+)?(?:short\s+|single\s+|numbered\s+)?([a-z]+)\b")
_WRITE_A = re.compile(
    r"\b(?:write|compose|draft|create|give me|make)\s+(?:me\s+)?(?:an?\s+)?(?:short\s+)?([a-z]+)\b"
)
_COUNTED = re.compile(
    r"\b(?:in|with|under|within|at most|no more than|exactly)\s+(\d+|one|two|three|four|five|ten)\s+"
    r"(words?|sentences?|paragraphs?|bullet points?|characters?)\b"
)
# A sentence that tells the answerer what to do ("Answer in French.", "Please list them as JSON.", "Can
# you explain it step by step?"); a statement about a list or a table is no instruction.
_DIRECTIVE = re.compile(
    r"^(?:please\s+|now\s+|and\s+|(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
    r"(?:answer|respond|reply|write|give|format|output|return|show|present|explain|summari[sz]e|describe|"
    r"tell|translate|say|list|provide|put|rewrite|draft|compose|make|create)\b"
)
_STEP_BY_STEP = re.compile(r"\bstep[- ]by[- ]step\b")
_ELI5 = re.compile(r"\b(?:like|as if) i(?:'m| am| were)\s+(?:a\s+)?(?:five|5|child|kid|beginner)\b")


@_memo
def _instructions(text: str) -> frozenset[str]:
    """What a prompt asks of the answer's form: its language ("in French"), format ("as a list",
    "in JSON", "a haiku"), length ("in 3 sentences", "briefly") and manner ("step by step", "like I'm
    five"), said in a sentence that tells the answerer what to do. Not what it asks about."""
    out: set[str] = set()
    for sentence in _SENTENCE_END.split(text.replace("\u2019", "'").lower()):
        sentence = sentence.strip(" ,\t")
        if _DIRECTIVE.match(sentence):
            out |= _asked_of(sentence)
    return frozenset(out)


def _asked_of(low: str) -> set[str]:
    out: set[str] = set()
    for word in _IN_LANGUAGE.findall(low):
        if word in LANGUAGES:
            out.add(f"language:{word}")
    for word in _AS_FORMAT.findall(low) + _WRITE_A.findall(low):
        if word in _FORMATS:
            out.add(f"format:{_FORMATS[word]}")
    for count, unit in _COUNTED.findall(low):
        out.add(f"length:{count} {unit.rstrip('s')}")
    for word in _words(low):
        if word in _LENGTH_WORDS:
            out.add(f"length:{_LENGTH_WORDS[word]}")
    if _IN_DEPTH.search(low):
        out.add("length:long")
    if _STEP_BY_STEP.search(low):
        out.add("manner:step by step")
    if _ELI5.search(low):
        out.add("manner:simple")
    return out


def instructions(cached: str, request: str) -> str | None:
    """The two ask for answers of another form: language, format, length or manner (the question may
    be the same; the answer is not: "What is the capital of France? Answer in French.")."""
    a, b = _instructions(cached), _instructions(request)
    if a == b:
        return None
    added, dropped = sorted(b - a), sorted(a - b)
    parts = ([f"asks {', '.join(added)}"] if added else []) + (
        [f"not {', '.join(dropped)}"] if dropped else []
    )
    return "instructions differ: the request " + "; ".join(parts)


# --- all of them --------------------------------------------------------------------------------------

Guard = Callable[[str, str], "str | None"]
GUARDS: dict[str, Guard] = {
    "negation": negation,
    "numbers": numbers,
    "entities": entities,
    "opposites": opposites,
    "instructions": instructions,
}


@dataclass(frozen=True, slots=True)
class GuardHit:
    guard: str
    reason: str


def check(cached: str, request: str, guards: dict[str, Guard] = GUARDS) -> GuardHit | None:
    """The first guard that fires on this pair, or None when all pass (the pair may still differ)."""
    for name, guard in guards.items():
        reason = guard(cached, request)
        if reason is not None:
            return GuardHit(name, reason)
    return None
