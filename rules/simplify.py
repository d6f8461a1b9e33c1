"""A cheaper pattern for the same lines: what the filter's DFA compiles instead of a rule.

Metric rules are written for field extraction: `iteration N/ M |(?:.*? lm loss: (?P<loss>..) \\|)?
(?:.*? grad norm: ... \\|)?.*`. As a set of lines, each optional group before the closing `.*`
adds nothing (whatever it matches, `.*` matches too), but RE2's DFA still tracks every way
through them. On the 1 GB Megatron log of bench/filter_bench.py the block program holding
the iteration rule ran at 233 MB/s; without those groups the whole filter went from 8.05 s
to 6.29 s on one core, with the same lines kept and the same progress read.

`line_language()` drops such groups. It only ever rewrites `X(?:Y)?.*` to `X.*` at the very
end of a pattern, and only when Y cannot match a newline, so the set of lines matched is
exactly the same; extraction keeps using the rule's own pattern.
"""

from __future__ import annotations

import re

# escapes that can match a newline, inside or outside a character class
_NEWLINE_ESCAPE = re.compile(r"\\(?:[nsDWRvpP]|x0[aA]|x\{0*[aA]\}|0*12|cJ)")


def _class_end(pattern: str, i: int) -> int:
    """Index just past the character class opening at pattern[i] == '['."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):  # a leading ']' is a literal
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _open_of_group_closing_at(pattern: str, closing: int) -> int | None:
    """Index of the '(' matching the ')' at pattern[closing], or None."""
    stack: list[int] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            stack.append(i)
        elif c == ")":
            if not stack:
                return None
            start = stack.pop()
            if i == closing:
                return start
        i += 1
    return None


def _can_match_newline(group: str) -> bool:
    """Conservative: True unless no part of the group can match a newline (a `(?s)` flag
    anywhere in the pattern is refused by line_language itself)."""
    i = 0
    while i < len(group):
        c = group[i]
        if c == "\\":
            if _NEWLINE_ESCAPE.match(group, i):
                return True
            i += 2
            continue
        if c == "[":
            end = _class_end(group, i)
            body = group[i + 1:end - 1]
            if body.startswith("^"):
                if "\\n" not in body:  # [^'] matches a newline, [^'\n] does not
                    return True
            elif _NEWLINE_ESCAPE.search(body):
                return True
            i = end
            continue
        i += 1
    return False


def _ends_with_unescaped_dot_star(pattern: str) -> bool:
    if not pattern.endswith(".*"):
        return False
    backslashes = len(pattern) - 2 - len(pattern[:-2].rstrip("\\"))
    return backslashes % 2 == 0


def line_language(pattern: str) -> str:
    """The pattern without optional groups that only precede its closing `.*`."""
    if re.search(r"\(\?[a-zA-Z]*s", pattern):
        return pattern  # `.` matches newlines there: the rewrite's argument does not hold
    while _ends_with_unescaped_dot_star(pattern):
        body = pattern[:-2]
        if not body.endswith(")?"):
            break
        start = _open_of_group_closing_at(body, len(body) - 2)
        if start is None:
            break
        group = body[start:-1]
        if _can_match_newline(group):
            break
        pattern = body[:start] + ".*"
    return pattern
