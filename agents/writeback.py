"""Write-back: a diagnosis rule synthesised from the agent's root-cause line, and the check
that it changes no earlier confirmed diagnosis. Pure: the service stores what passes.

Synthesis generalises the variables of the line the way the Log Agent's templates do
(`agents.templates.mask`: time stamps, hosts, addresses, paths, hex ids, numbers become typed
classes; a quoted single token such as a variable, key or module name becomes any such
token) and keeps the fixed words literal. The launcher envelope and a leading log header
(glog, time stamp, NCCL's host:pid:tid prefix) are left out, because a diagnosis pattern is
searched anywhere in the message. The first path becomes the named group `path`, so the
rule's mitigation can name the missing file of the next job ({g_path}).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agents.templates import VAR_TYPES, mask
from rules.classifier import DiagnosisProgram
from rules.envelope import split_envelope
from rules.model import DiagnosisRule, Tier
from rules.taxonomy import Action, Origin, reason

MAX_MESSAGE_CHARS = 200
"""The head of a long line names the failure; the pattern stops at a token boundary here."""
MIN_LITERAL_WORD = 3

_OPEN, _CLOSE = "\ue000", "\ue001"
_PIECE = re.compile(f"{_OPEN}(\\w+){_CLOSE}")
_OUT = {t.name: t.out for t in VAR_TYPES}
_WORD = re.compile(r"[A-Za-z]{3,}")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class LabelledLine:
    """A line of the stored labelled history: a confirmed incident's text and its reason."""

    text: str
    reason: str
    confirmed_by: str = ""
    ref: str = ""
    """What to name in a refusal (`incident <id>`, `job <id>`)."""


@dataclass(frozen=True, slots=True)
class Conflict:
    ref: str
    confirmed_reason: str
    new_reason: str
    line: str
    confirmed_by: str = ""

    @property
    def message(self) -> str:
        how = f" (confirmed by {self.confirmed_by})" if self.confirmed_by else ""
        return (f"it would change the diagnosis of {self.ref}{how} from {self.confirmed_reason} to "
                f"{self.new_reason}: {self.line[:160]!r}")


def _head(masked: str) -> str:
    """The masked message from its first literal word on, cut at a token boundary."""
    m = re.search(r"[A-Za-z]{3,}", _PIECE.sub(lambda p: " " * len(p.group(0)), masked))
    start = m.start() if m else 0
    # do not cut inside a placeholder: step back to the token that holds the word
    while start > 0 and not masked[start - 1].isspace() and masked[start - 1] not in "[(":
        start -= 1
    head = masked[start:]
    if len(head) > MAX_MESSAGE_CHARS:
        cut = head.rfind(" ", 0, MAX_MESSAGE_CHARS)
        head = head[:cut if cut > MAX_MESSAGE_CHARS // 2 else MAX_MESSAGE_CHARS]
        if head.count(_OPEN) != head.count(_CLOSE):
            head = head[:head.rfind(_OPEN)]
    return head.rstrip()


def pattern_from_line(line: str) -> str:
    """A regex for the failure a line reports: literals escaped, variables typed."""
    message = split_envelope(line).message.strip()
    masked = _head(mask(message))
    out: list[str] = []
    pos = 0
    named = False
    for m in _PIECE.finditer(masked):
        out.append(_literal(masked[pos:m.start()]))
        kind = m.group(1)
        if kind == "path" and not named:
            out.append(f"(?P<path>{_OUT[kind]})")
            named = True
        else:
            out.append(f"(?:{_OUT[kind]})")
        pos = m.end()
    out.append(_literal(masked[pos:]))
    return "".join(out)


_QUOTED = re.compile(r"(['\"`])([^'\"`\s]{1,80})\1")
_QUOTED_OUT = {"'": r"'[^'\s]+'", '"': r'"[^"\s]+"', "`": r"`[^`\s]+`"}


def _literal(text: str) -> str:
    """Fixed words escaped, whitespace runs as ` +`; a quoted single token (a variable, key,
    flag or module name) is a value that changes from job to job."""
    out, pos = [], 0
    for m in _QUOTED.finditer(text):
        out.append(_words(text[pos:m.start()]))
        out.append(_QUOTED_OUT[m.group(1)])
        pos = m.end()
    out.append(_words(text[pos:]))
    return "".join(out)


def _words(text: str) -> str:
    return " +".join(re.escape(part) for part in _SPACE.split(text))


def rule_id_for(pattern: str, reason_id: str) -> str:
    digest = hashlib.sha1(f"{reason_id}\x00{pattern}".encode()).hexdigest()[:10]
    return f"fa.{reason_id.replace('_', '-')}.{digest}"


def synthesise_rule(line: str, *, reason_id: str, origin: str, tier: Tier, mitigation: str = "",
                    description: str = "", scope: str = "global") -> DiagnosisRule:
    """A diagnosis rule for the failure `line` reports, labelled as the agent decided."""
    pattern = pattern_from_line(line)
    entry = reason(reason_id)
    infra = origin == Origin.INFRASTRUCTURE.value
    action = entry.action if not infra or entry.action is not Action.FIX_AND_RESUBMIT else Action.RESTART
    return DiagnosisRule(
        id=rule_id_for(pattern, reason_id), reason=reason_id, tier=tier, patterns=(pattern,),
        origin=Origin(origin), action=action, mitigation=mitigation, description=description,
        scope=scope, source="failure_agent", examples=(line,))


def history_conflicts(candidate: DiagnosisRule, rules_in_force: Sequence[DiagnosisRule],
                      history: Sequence[LabelledLine], *, limit: int = 5) -> list[Conflict]:
    """Confirmed lines whose diagnosis the candidate would change: lines it would take (it is
    the best rule for them once added) whose confirmed reason is another."""
    after = DiagnosisProgram([*rules_in_force, candidate])
    out: list[Conflict] = []
    for item in history:
        if item.reason == candidate.reason:
            continue
        hit = after.match(split_envelope(item.text).message)
        if hit is not None and hit[0].id == candidate.id:
            out.append(Conflict(item.ref or "an earlier case", item.reason, candidate.reason, item.text, item.confirmed_by))
            if len(out) >= limit:
                break
    return out


def has_literal_words(pattern_source_line: str) -> bool:
    """Whether a line has enough fixed words to make a rule of (not only values)."""
    return len(_WORD.findall(_PIECE.sub(" ", mask(split_envelope(pattern_source_line).message)))) >= 2
