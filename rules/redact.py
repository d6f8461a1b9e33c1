"""Secret redaction for kept lines, before anything is stored or sent to an LLM.

Dropped lines are never stored, so only kept lines pass through here. A private key is a
block of lines, so a Redactor keeps state per source.

Two rule sets: ours below (shapes seen in training logs: DSN passwords, `--hf-token x`,
`PGPASSWORD=`), and the maintained one of Yelp's detect-secrets (its regex plugins: cloud,
chat, package-registry and payment tokens), read from the installed package so that its
updates reach us. Its entropy plugins (a commit hash, a checkpoint's digest) and its public-IP
plugin (the addresses that name a suspect node) are left out: they would mask what a
diagnosis must show.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

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


_LEFT_OUT = frozenset({"HexHighEntropyString", "Base64HighEntropyString", "IPPublicDetector", "KeywordDetector",
                       "PrivateKeyDetector"})
"""detect-secrets plugins not used: entropy and public IPs (see above); keywords and private
key blocks, which the rules here do with training logs' own shapes (and a block's lines)."""
_DELIMITERS = " \t=:\"'"
_MIN_SECRET_GROUP = 8


def _mask_match(match: re.Match[str]) -> str:
    """A detect-secrets match masked: its first group when that is the secret (AWS's 40
    characters after `aws_secret = `), else the whole match without the delimiters some of its
    patterns take in (Artifactory's `(?:\\s|=|:|"|^)`). A short first group is a token's
    prefix (GitLab's `(glpat|gldt|...)`), not the secret."""
    whole = match.group(0)
    if match.re.groups and match.group(1) is not None and len(match.group(1)) >= _MIN_SECRET_GROUP:
        start, end = match.start(1) - match.start(), match.end(1) - match.start()
    else:
        start = len(whole) - len(whole.lstrip(_DELIMITERS))
        end = len(whole.rstrip(_DELIMITERS))
    return whole[:start] + MASK + whole[end:] if end > start else whole


def _from_detect_secrets() -> list[tuple[str, str, int]]:
    """The regexes of detect-secrets' regex plugins: (plugin, pattern, flags of Python's re)."""
    import importlib
    import inspect
    import pkgutil

    import detect_secrets.plugins as plugins
    from detect_secrets.plugins.base import RegexBasedDetector

    found: list[tuple[str, str, int]] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(plugins.__path__)):
        loaded = importlib.import_module(f"{plugins.__name__}.{module}")
        for name, cls in sorted(inspect.getmembers(loaded, inspect.isclass)):
            if issubclass(cls, RegexBasedDetector) and cls is not RegexBasedDetector and cls.__module__ == loaded.__name__:
                found.extend((name, p.pattern, p.flags) for p in cls().denylist)
    return found


def _maintained_rules() -> list[re.Pattern[str]]:
    """detect-secrets' patterns but those _LEFT_OUT, from the cache (keyed by the installed
    plugins' own files, found without importing the package: its import took 0.18 s of every
    start, and importlib.metadata's 20 ms more) or from the package itself."""
    import importlib.util

    from rules.disk_cache import derived_json

    package = importlib.util.find_spec("detect_secrets")
    if package is None or not package.submodule_search_locations:
        raise ImportError("detect-secrets is not installed: it holds the secret patterns redaction needs")
    plugins = sorted((Path(package.submodule_search_locations[0]) / "plugins").glob("*.py"))
    found = derived_json("detect-secrets", plugins, _from_detect_secrets)
    return [re.compile(pattern, flags & ~re.UNICODE) for name, pattern, flags in found if name not in _LEFT_OUT]


_MAINTAINED = _maintained_rules()


def _re2_shape(pattern: re.Pattern[str]) -> str:
    """A maintained pattern for the RE2 prefilter: its case flag kept, repetitions within RE2's
    bound of 1,000 (GitLab's `{50,1024}`: a longer token still matches its first 1,000)."""
    text = re.sub(r"\{(\d+),(\d{4,})\}", lambda m: "{%s,1000}" % m.group(1), pattern.pattern)
    return f"(?i:{text})" if pattern.flags & re.IGNORECASE else text


# A line is looked at by the rules above only when it may match one of them. Most lines match
# none, and one RE2 pass (a DFA, linear) over a whole batch of lines settles it; a cruder
# trigger of key words ("token", "://") sent every progress line reporting tokens/s and every
# URL through all the rules (Python's re, ~9 us a rule), two thirds of a first `compress`.
_SHAPES = [p.pattern for p, _ in _RULES[:-1]] + [
    # the last rule's value without its look-ahead: not only digits and dots (`consumed
    # tokens: 2015`, on every Megatron progress line), said as "holds another character"
    _SECRET_KEY + r"(\"[^\"]{4,200}\"|'[^']{4,200}'|[^\s,;}\"']*[^\s,;}\"'\d.][^\s,;}\"']*|\.{4,})"]
_SHAPES += [_re2_shape(p) for p in _MAINTAINED]
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
        for pattern in _MAINTAINED:
            out, n = pattern.subn(_mask_match, out)
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
