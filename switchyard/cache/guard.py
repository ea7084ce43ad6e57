"""The guard: a semantic neighbour's answer is served only if the two prompts agree on what cosine
similarity cannot see. A cached answer is refused when the asked prompt differs from the cached one
in a negation, a number, a quoted string, a code identifier, a named entity, or the order of its
names (or of its words around a "to", "from" or "than")
(docs/cache.md, "The guard"; designed from `switchyard eval cache`'s pairs).

Pure Python, a few regular expressions a pair: cheap enough for every candidate of every request.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

# The thresholds `switchyard eval cache` picked on the shipped pairs (tests check they agree), by the
# embedder of the last user turn (EMBEDDER_CHOICES in classifier/embedder.py): the static embedder
# puts every pair closer together, so it needs a higher one. DEFAULT_SIMILARITY is the full MiniLM's.
DEFAULT_SIMILARITY_BY_EMBEDDER: dict[str, float] = {"minilm": 0.895, "static": 0.975}
DEFAULT_SIMILARITY: float = DEFAULT_SIMILARITY_BY_EMBEDDER["minilm"]

_NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot", "nowhere"}
)
_ANTONYMS = (
    ("enable", "disable"),
    ("enabled", "disabled"),
    ("allow", "deny"),
    ("allow", "block"),
    ("add", "remove"),
    ("include", "exclude"),
    ("increase", "decrease"),
    ("before", "after"),
    ("maximum", "minimum"),
    ("max", "min"),
    ("largest", "smallest"),
    ("biggest", "smallest"),
    ("most", "least"),
    ("more", "less"),
    ("more", "fewer"),
    ("true", "false"),
    ("start", "stop"),
    ("open", "close"),
    ("encrypt", "decrypt"),
    ("install", "uninstall"),
    ("upload", "download"),
    ("import", "export"),
    ("buy", "sell"),
    ("win", "lose"),
    ("positive", "negative"),
    ("higher", "lower"),
    ("always", "never"),
    ("with", "without"),
    ("above", "below"),
    ("advantages", "disadvantages"),
    ("pros", "cons"),
    ("best", "worst"),
    ("first", "last"),
    ("hot", "cold"),
    ("even", "odd"),
    ("on", "off"),
    ("up", "down"),
    ("in", "out"),
    ("lock", "unlock"),
    ("show", "hide"),
    ("accept", "reject"),
    ("push", "pull"),
    ("input", "output"),
    ("min", "max"),
    ("ascending", "descending"),
    ("left", "right"),
    ("old", "new"),
    ("older", "younger"),
    ("longer", "shorter"),
    ("taller", "shorter"),
    ("faster", "slower"),
    ("cheaper", "expensive"),
    ("increasing", "decreasing"),
    ("smaller", "larger"),
    ("smaller", "bigger"),
    ("greater", "less"),
    ("greatest", "least"),
    ("highest", "lowest"),
    ("minimize", "maximize"),
    ("success", "failure"),
    ("all", "none"),
    ("every", "no"),
    ("same", "different"),
    ("inside", "outside"),
    ("upper", "lower"),
    ("uppercase", "lowercase"),
    ("north", "south"),
    ("east", "west"),
    ("male", "female"),
    ("rich", "poor"),
    ("valid", "invalid"),
    ("legal", "illegal"),
    ("possible", "impossible"),
    ("like", "dislike"),
    ("love", "hate"),
    ("agree", "disagree"),
)
_OPPOSITE: dict[str, frozenset[str]] = {}
for _a, _b in _ANTONYMS:
    _OPPOSITE[_a] = _OPPOSITE.get(_a, frozenset()) | {_b}
    _OPPOSITE[_b] = _OPPOSITE.get(_b, frozenset()) | {_a}

_NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion trillion half twice thrice double triple dozen first second third fourth fifth sixth seventh eighth "
    "ninth tenth".split()
)
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:[.,:/]\d+)*")
_QUOTE_MARKS = ('"', "“", "'", "`")
_QUOTED = re.compile(r"\"([^\"\n]+)\"|“([^”\n]+)”|(?<![A-Za-z])'([^'\n]+)'(?![A-Za-z])|`([^`\n]+)`")
# a name as code writes it: one pass finds every word (with its dots and a call's parenthesis);
# those spelt as only code spells them are kept (_is_identifier)
_CODE_WORD = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(?", re.ASCII)
_CAMEL = re.compile(r"[a-z]+[A-Z]")  # fetchData, not NodeJS
_DOTTED_OR_CAMEL = re.compile(r"\b[a-z]+[A-Z]|\w\.[A-Za-z_]", re.ASCII)
_DEF_KEYWORDS = ("def ", "class ", "function ", "fn ", "func ")
_DEF = re.compile(r"\b(?:def|class|function|fn|func)\s+([A-Za-z_]\w*)", re.IGNORECASE)
# capitalised words that open questions, commands and greetings: never the name of a thing
_COMMON_CAPITALISED = frozenset(
    "i a an the what which who whom whose how why when where is are was were do does did can could should would "
    "will shall may might must please write explain describe tell give list make create show find hi hello hey "
    "thanks thank question answer in on at for of to and or but if so as by from with this that these those it "
    "its my your our their there here yes no ok okay quick quickly briefly also then now let lets imagine suppose "
    "assume consider given generate compose summarize summarise translate compare calculate solve help could "
    "he she they we you his her him them each every all some any one two three first next finally after before "
    "during while since because although however note answer step use using act pretend based provide rewrite "
    "design implement build develop fix debug convert name identify choose select determine evaluate discuss "
    "analyze analyse outline draft suggest recommend ask say read hey dear sorry great good".split()
)
_DIRECTIONAL = frozenset({"to", "into", "from", "than", "vs", "versus", "over", "onto", "toward", "towards"})
_STOP_WORDS = frozenset(
    "a an the of to into from than vs versus over onto toward towards in on at for and or is are be it this that "
    "with by as what which how do does i you me my can could would should will please".split()
)


@dataclass(frozen=True, slots=True)
class _Features:
    """What the guard compares of one prompt."""

    words: tuple[str, ...]  # lower-cased, in order
    counts: Counter[str]
    negations: int
    numbers: Counter[str]
    quoted: Counter[str]
    identifiers: Counter[str]
    names: frozenset[str]  # capitalised words that are not common sentence openers, lower-cased


@lru_cache(maxsize=4096)
def _features(text: str) -> _Features:
    tokens = _WORD.findall(text)
    words = tuple(map(str.lower, tokens))
    counts = Counter(words)
    present = counts.keys()
    numbers = Counter(n.replace(",", "") for n in _NUMBER.findall(text))
    for word in _NUMBER_WORDS & present:
        numbers[word] += counts[word]
    negations = sum(counts[w] for w in _NEGATIONS & present)
    if "n't" in text:
        negations += sum(counts[w] for w in present if w.endswith("n't"))
    identifiers: Counter[str] = Counter()
    if "_" in text or "(" in text or _DOTTED_OR_CAMEL.search(text):
        identifiers.update(w.rstrip("(") for w in _CODE_WORD.findall(text) if _is_identifier(w))
    if any(keyword in text or keyword.title() in text for keyword in _DEF_KEYWORDS):
        identifiers.update(_DEF.findall(text))
    capitalised = {t.lower().split("'")[0] for t in tokens if t[0].isupper()}
    return _Features(
        words=words,
        counts=counts,
        negations=negations,
        numbers=numbers,
        quoted=_quoted(text),
        identifiers=identifiers,
        names=frozenset(capitalised - _COMMON_CAPITALISED),
    )


def _is_identifier(word: str) -> bool:
    """snake_case, dotted.names, calls(), camelCase."""
    return "_" in word or "." in word or word.endswith("(") or _CAMEL.match(word) is not None


def _quoted(text: str) -> Counter[str]:
    if not any(mark in text for mark in _QUOTE_MARKS):
        return Counter()
    return Counter(next(g for g in m.groups() if g is not None).strip().casefold() for m in _QUOTED.finditer(text))


def _stems(counts: Counter[str]) -> set[str]:
    """Words without a possessive or contraction: "paris's" -> "paris"."""
    return {w.split("'")[0] for w in counts}


def _antonym_swap(asked: Counter[str], cached: Counter[str]) -> bool:
    """A word the asked prompt has more of, whose opposite the cached one has more of."""
    more = {w for w in asked.keys() | cached.keys() if w in _OPPOSITE and asked[w] > cached[w]}
    fewer = {w for w in asked.keys() | cached.keys() if w in _OPPOSITE and asked[w] < cached[w]}
    return any(_OPPOSITE[w] & fewer for w in more)


def _word_order(asked: tuple[str, ...], cached: tuple[str, ...], names: frozenset[str]) -> bool:
    """The same names, or the same content words around a "to"/"from"/"than", in another order:
    "from Paris to Rome" is not "from Rome to Paris"."""
    if len(names) > 1 and [w for w in asked if w in names] != [w for w in cached if w in names]:
        return True
    if _DIRECTIONAL.isdisjoint(asked) and _DIRECTIONAL.isdisjoint(cached):
        return False
    asked_content = [w for w in asked if w not in _STOP_WORDS]
    cached_content = [w for w in cached if w not in _STOP_WORDS]
    return asked_content != cached_content and Counter(asked_content) == Counter(cached_content)


def guard_reason(asked: str, cached: str) -> str | None:
    """None when the cached prompt's answer may serve the asked prompt; else why not: "negation",
    "number", "quoted string", "code identifier", "entity" or "word order"."""
    if asked == cached:
        return None
    a, c = _features(asked), _features(cached)
    if a.negations != c.negations or _antonym_swap(a.counts, c.counts):
        return "negation"
    if a.numbers != c.numbers:
        return "number"
    if a.quoted != c.quoted:
        return "quoted string"
    if a.identifiers != c.identifiers:
        return "code identifier"
    # a name that one side capitalises and the other only lower-cases ("paris") is the same name
    if not (a.names <= c.counts.keys() and c.names <= a.counts.keys()) and not (
        a.names <= _stems(c.counts) and c.names <= _stems(a.counts)
    ):
        return "entity"
    if _word_order(a.words, c.words, a.names | c.names):
        return "word order"
    return None
