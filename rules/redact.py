"""Secret redaction for kept lines, before anything is stored or sent to an LLM.

Dropped lines are never stored, so only kept lines pass through here. A private key is a
block of lines, so a Redactor keeps state per source.
"""

from __future__ import annotations

import bisect
import re

import re2

MASK = "[REDACTED]"

_SECRET_KEY = (r"(?i)(?<!pad_)(?<!bos_)(?<!eos_)(?<!unk_)(?<!sep_)(?<!cls_)(?<!mask_)"
               r"((?:password|passwd|secret(?:[_-]?(?:access[_-]?)?key)?|client[_-]?secret|token|api[ _-]?key"
               r"|access[_-]?key|private[_-]?key|credential)s?[\"']?"
               r"\s*(?:[=:]|\s)\s*(?:\.{2,}\s*)?)")
"""A word that names a secret, then `=`, `:` or a space: what a secret value follows."""

# (pattern, replacement) applied in order; replacements keep what tells a reader what it was.
_RULES: list[tuple[re.Pattern[str], str]] = [
    # scheme://user:password@host (DSNs, git remotes, S3/HTTP with basic auth); the password
    # runs to the last @ before the host, so one holding '/' or '@' is masked whole
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^\s]*@(?=[\w.-]+(?:[:/\s?#]|$))"), r"\1" + MASK + "@"),
    # webhook URLs carry their secret in the path; SAS and signed URLs in `sig=`
    (re.compile(r"(hooks\.slack\.com/(?:services|workflows|triggers)/)\S+"), r"\1" + MASK),
    (re.compile(r"([?&](?:sig|X-Amz-Signature|Signature)=)[^&\s\"']+"), r"\1" + MASK),
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), MASK),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), MASK),
    (re.compile(r"(?i)(\b(?:set-)?cookie\s*:\s*)\S.*"), r"\1" + MASK),
    (re.compile(r"(\bsshpass\s+-p\s*)\S+"), r"\1" + MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), MASK),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})\b"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{12,}"), r"\1\2" + MASK),
    # key = value where the key names a secret (PGPASSWORD=, "api_key": "...", --hf-token x)
    # A tokenizer's special tokens (pad_token = tokenizer.eos_token) name no secret: they are in
    # HF's own error texts that a diagnosis must quote whole.
    (re.compile(_SECRET_KEY + r"(\"[^\"]{4,200}\"|'[^']{4,200}'|(?![\d.]+\b)[^\s,;}\"']{4,})"), r"\1" + MASK),
]


def _line_superset(pattern: str) -> str:
    """An RE2 pattern that matches every line `pattern` matches, and never across lines.

    Look-ahead and look-behind assertions are left out (an assertion only ever narrows a
    match, and RE2 has none). Batches of lines are searched joined by newlines, so negated
    classes and `\\s` are kept off the newline: a match that ran on into the next line could
    swallow that line's own secret and leave it unredacted.
    """
    out, i, in_class = [], 0, False
    while i < len(pattern):
        if pattern[i] == "\\":
            escape = pattern[i:i + 2]
            out.append("[^\\S\\n]" if escape == "\\s" and not in_class else escape)
            i += 2
        elif in_class:
            in_class = pattern[i] != "]"
            out.append(pattern[i])
            i += 1
        elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            depth = 0
            while True:  # skip to the assertion's closing parenthesis
                if pattern[i] == "\\":
                    i += 2
                    continue
                depth += {"(": 1, ")": -1}.get(pattern[i], 0)
                i += 1
                if depth == 0:
                    break
        elif pattern.startswith("[^", i):
            out.append("[^\\n")
            in_class, i = True, i + 2
        else:
            in_class = pattern[i] == "["
            out.append(pattern[i])
            i += 1
    return "".join(out)


# A line is looked at by the rules above only when it may match one of them. Most lines match
# none, and one RE2 pass (a DFA, linear) over a whole batch of lines settles it; a cruder
# trigger of key words ("token", "://") sent every progress line reporting tokens/s and every
# URL through all the rules (Python's re, ~9 us a rule), two thirds of a first `compress`.
_SHAPES = [p.pattern for p, _ in _RULES[:-1]] + [
    # the last rule's value without its look-ahead: not only digits and dots (`consumed
    # tokens: 2015`, on every Megatron progress line), said as "holds another character"
    _SECRET_KEY + r"(\"[^\"]{4,200}\"|'[^']{4,200}'|[^\s,;}\"']*[^\s,;}\"'\d.][^\s,;}\"']*|\.{4,})"]
_MAY_MATCH = re2.compile("|".join(f"(?:{_line_superset(shape)})" for shape in _SHAPES))
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")


class Redactor:
    """Redacts secrets line by line; one per source, because key blocks span lines."""

    def __init__(self) -> None:
        self._in_key = False
        self.redactions = 0

    @property
    def in_key(self) -> bool:
        """Inside a private key block: the next lines are masked until its end."""
        return self._in_key

    def redact(self, line: str) -> str:
        if self._in_key:
            if _KEY_END.search(line):
                self._in_key = False
                return _KEY_END.sub(lambda m: m.group(0), line[line.find("-----END"):])
            self.redactions += 1
            return MASK
        begin = _KEY_BEGIN.search(line)
        if begin:
            self._in_key = not _KEY_END.search(line, begin.end())
            self.redactions += 1
            return line[: begin.end()] + MASK
        if _MAY_MATCH.search(line) is None:
            return line
        out = line
        for pattern, replacement in _RULES:
            out, n = pattern.subn(replacement, out)
            self.redactions += n
        return out


    def redact_many(self, lines: list[str]) -> list[str]:
        """Redact a batch of lines; only lines that may hold a secret are looked at closely."""
        if not lines:
            return lines
        joined = "\n".join(lines)
        if self._in_key or "PRIVATE KEY" in joined:
            return [self.redact(line) for line in lines]
        if _MAY_MATCH.search(joined) is None:
            return lines
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        hit = sorted({bisect.bisect_right(starts, m.start()) - 1 for m in _MAY_MATCH.finditer(joined)})
        out = list(lines)
        for i in hit:
            out[i] = self.redact(lines[i])
        return out


def redact_text(text: str) -> str:
    """Redact a whole block of text (e.g. a request body or a prompt)."""
    redactor = Redactor()
    return "\n".join(redactor.redact(line) for line in text.split("\n"))
