"""Rule patterns run in linear time: RE2's subset, and the name of what a pattern needs beyond it.

A rule pattern is matched against untrusted log lines, so its cost must not depend on what
a line holds beyond its length. RE2 guarantees that; Python's engines backtrack, and a
pattern such as `tickle (a|a)*b` costs seconds on one line built for it. Every place that
evaluates a rule (the classifier's set and its group readers, the filter engine, progress
fields) compiles through here, and a pattern RE2 cannot run is refused with the feature
that needs backtracking named, so the person who wrote it knows what to change.
"""

from __future__ import annotations

import re
import re._constants as sre_c  # noqa: PLC2701 - the parse tree is the only exact way to inspect a pattern
import re._parser as sre_parse  # noqa: PLC2701
from functools import lru_cache

import re2

_FEATURES = {
    sre_c.ASSERT: "a lookahead or lookbehind (?=...) (?<=...)",
    sre_c.ASSERT_NOT: "a negative lookahead or lookbehind (?!...) (?<!...)",
    sre_c.GROUPREF: "a backreference (\\1, (?P=name))",
    sre_c.GROUPREF_EXISTS: "a conditional group (?(1)...)",
}
for _name, _what in (("ATOMIC_GROUP", "an atomic group (?>...)"),
                     ("POSSESSIVE_REPEAT", "a possessive quantifier (*+, ++, ?+)")):
    if hasattr(sre_c, _name):  # Python >= 3.11
        _FEATURES[getattr(sre_c, _name)] = _what


class NotLinear(ValueError):
    """A pattern RE2 cannot run: it needs backtracking, or RE2 does not parse it."""


@lru_cache(maxsize=4096)
def backtracking_feature(pattern: str) -> str | None:
    """The first feature of `pattern` that only a backtracking engine has, or None.
    Remembered per pattern: every filter program checks each of its rules, and the Log
    Agent builds dozens of programs from mostly the same rules while it learns."""
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None  # RE2's own message says what is wrong
    return _find(tree)


def _find(node) -> str | None:
    for op, av in node:
        if op in _FEATURES:
            return _FEATURES[op]
        for child in _children(op, av):
            found = _find(child)
            if found:
                return found
    return None


def _children(op, av) -> list:
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) or op is getattr(sre_c, "POSSESSIVE_REPEAT", None):
        return [av[2]]
    if op is sre_c.SUBPATTERN:
        return [av[3]]
    if op is sre_c.BRANCH:
        return list(av[1])
    if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
        return [av[1]]
    if op is sre_c.GROUPREF_EXISTS:
        return [branch for branch in av[1:] if branch is not None]
    if op is getattr(sre_c, "ATOMIC_GROUP", None):
        return [av]
    return []


def options(*, latin1: bool = False, capture: bool = True) -> re2.Options:
    opts = re2.Options()
    opts.log_errors = False  # a refused pattern is reported to its author, not to stderr
    opts.never_capture = not capture
    if latin1:
        opts.encoding = re2.Options.Encoding.LATIN1  # any byte is a character: matches raw log bytes
    return opts


def refusal(pattern: str, error: Exception) -> str:
    """Why RE2 refuses a pattern, in the author's terms."""
    feature = backtracking_feature(pattern)
    if feature:
        return f"uses {feature}, which needs a backtracking engine; rules run in linear time (RE2)"
    detail = error.args[0] if error.args else error
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    return f"RE2 cannot compile it: {detail}"


def compile_linear(pattern: str | bytes, *, latin1: bool = False):
    """An RE2 regexp with Python's match API (`search`, `match`, `findall`, groups).

    `latin1` reads bytes as one character each, as the filter engine does; otherwise text
    is UTF-8. Raises NotLinear naming what RE2 cannot run.
    """
    try:
        return re2.compile(pattern, options(latin1=latin1))
    except (re2.error, UnicodeEncodeError) as exc:
        text = pattern.decode("latin-1") if isinstance(pattern, bytes) else pattern
        raise NotLinear(refusal(text, exc)) from None


_UNANCHORED = re2._Anchor.UNANCHORED  # noqa: SLF001 - the module's own constant for Match
_NO_SPAN = (-1, -1)


def findall_bytes(regexp, data: bytes, pos: int, endpos: int) -> list:
    """`regexp.findall(data, pos, endpos)` for bytes, read from RE2's spans directly.

    The binding's own findall builds a Python match object per hit (about 17 us); reading
    every metric line of a format no pack knows (a loss per line, until sampling starts)
    spent more time there than in the filter itself. Same results: a group that did not take
    part is b"", one group gives its value, several give a tuple.
    """
    raw, groups, out = regexp._regexp, regexp.groups, []  # noqa: SLF001 - the binding's RE2 object
    while pos <= endpos:
        spans = raw.Match(_UNANCHORED, data, pos, endpos)
        whole = spans[0]
        if whole == _NO_SPAN:
            break
        if groups == 0:
            out.append(data[whole[0]:whole[1]])
        elif groups == 1:
            out.append(b"" if spans[1] == _NO_SPAN else data[spans[1][0]:spans[1][1]])
        else:
            out.append(tuple(b"" if s == _NO_SPAN else data[s[0]:s[1]] for s in spans[1:]))
        pos = whole[1] + 1 if whole[1] == whole[0] else whole[1]
    return out


def search_groups(regexp, text: str) -> tuple[str | None, ...] | None:
    """`regexp.search(text).groups()` (a group that did not take part is None), read from
    RE2's spans on the text's UTF-8 bytes: the binding's `search` on a str re-encodes the text
    and maps every span back to characters, and its `group(name)` rebuilds the name table on
    each call; for a regexp run on every kept line that was most of its cost."""
    data = text.encode("utf-8", "surrogatepass")
    spans = regexp._regexp.Match(_UNANCHORED, data, 0, len(data))  # noqa: SLF001 - the binding's RE2 object
    if spans[0] == _NO_SPAN:
        return None
    return tuple(None if s == _NO_SPAN else data[s[0]:s[1]].decode("utf-8", "surrogatepass") for s in spans[1:])
