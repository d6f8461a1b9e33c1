"""The filter engine: drops routine lines at DFA speed and remembers what it dropped.

How the hot loop works, and why (figures from bench/filter_bench.py on this machine):

* Each rule is compiled by RE2 into a run program `(?:ENVELOPE rule\\n)+`, anchored at a
  line start, without captures so that RE2 stays on its DFA. One call consumes a whole run
  of consecutive lines of one rule: the call costs ~2 µs of Python, the scan ~2 ns a byte.
* Runs are short when rules interleave (a Megatron iteration line, then a timer block, ...).
  The loop predicts the next rule from the last one seen after it, and when the last few
  runs repeat with a period of 2-6 runs it compiles that period into one block program
  `(?:(?:A\\n){1}(?:B\\n){1}(?:C\\n){5})+`, which then consumes thousands of periods per
  call. Counts stay exact: a block match is a whole number of periods.
* Where a few rules take turns at random (step lines between data-loader lines), no period
  exists and every run is one trip through the loop. After a few period searches find
  nothing, the loop consumes such stretches with one union program `(?:(?:A|B)\n)+` and
  counts each rule's lines by a literal all its lines hold (bytes.count); counts stay
  exact because the stretch is taken only when those counts add up to its lines.
* Which lines are error-like is decided before, by the guard (rules/guard.py), on the whole
  buffer; the loop only ever runs between error-like lines, so no rule can drop one.
* Progress fields are read, with Python `re`, only from the lines of metric rules.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache

import re2

from rules.envelope import ENVELOPE_PATTERN
from rules.extract import Columns, FieldError, FieldExtractor, non_capturing
from rules.guard import ErrorGuard
from rules.linear import backtracking_feature, refusal
from rules.literals import distinct_literals
from rules.model import FilterRule, KeptLine, RuleStats
from rules.simplify import line_language

_ANCHOR_START = re2._Anchor.ANCHOR_START
_ANCHOR_BOTH = re2._Anchor.ANCHOR_BOTH
_UNANCHORED = re2._Anchor.UNANCHORED
MAX_BLOCK_PERIOD = 6
MAX_BLOCK_LINES = 32
MAX_BLOCK_PROGRAMS = 64
MAX_BLOCK_WAIT = 31
"""Runs to wait, at most, before looking for a period again after a search found none."""
MIX_AFTER_MISSES = 3
"""Period searches that find nothing in a row before the loop tries a mixed run."""
MAX_MIX_RULES = 6
"""Rules in one mix at most: helix's step and data lines with its perf and heartbeat lines."""
MAX_MIX_FAILS = 16
"""Mixed-run tries in a row that consume nothing before the loop stops trying that mix."""
MAX_KEPT_LINE_CHARS = 8192
SAMPLE_BYTES = 64 << 10
"""Dense metric lines are read at most once per this many bytes of log (see _extract)."""
MAX_SAMPLES_PER_RUN = 256
SAMPLE_AFTER_BYTES = 1 << 20
"""Every metric line of a log's first megabyte is read: a pasted log or a short run keeps
its whole loss curve (a blip of a few steps is all a 2,000-step paste may show). Past it,
reading every line was the larger part of the time on a format whose metric lines are not
in blocks (2 of 3.4 s on 30 MB of the bench's "helix" format), for samples that tell the
same story."""



_FRAME = b'", line '
"""In a Python traceback frame (`  File "train.py", line 42, in step`): the line after it is
the frame's source line."""

def _texts_of(joined: bytes, numbers: list[int]):
    """line_text for a batch: the text of metric line `number`, split only when asked."""
    lines: list[bytes] = []
    index = {number: i for i, number in enumerate(numbers)}

    def line_text(number: int) -> str:
        if not lines:
            lines.extend(joined.split(b"\n"))
        return lines[index[number]].decode("utf-8", "replace")

    return line_text


class _Rows:
    """Metric rules' runs of lines within one buffer, gathered to be read together, one batch
    per rule. The batches are read in the order of their first lines: within a buffer (a few
    MB) the points of two metric rules (a loss line and a heartbeat line) come rule by rule,
    each rule's own in order, which is all the spike and hang detectors compare."""

    __slots__ = ("batches",)

    def __init__(self) -> None:
        self.batches: dict[int, tuple[list[bytes], list[int]]] = {}

    def add(self, k: int, data: bytes, start: int, stop: int, first_line: int, total: int) -> None:
        pieces, numbers = self.batches.setdefault(k, ([], []))
        pieces.append(data[start:stop - 1] if data[stop - 1:stop] == b"\n" else data[start:stop])
        numbers.extend(range(first_line, first_line + total))

    def take(self) -> list[tuple[int, bytes, list[int]]]:
        out = sorted(((k, b"\n".join(pieces), numbers) for k, (pieces, numbers) in self.batches.items()),
                     key=lambda batch: batch[2][0])
        self.batches = {}
        return out


class FilterCompileError(ValueError):
    """A filter rule's pattern cannot be compiled."""


def _re2_options() -> re2.Options:
    opts = re2.Options()
    opts.encoding = re2.Options.Encoding.LATIN1  # any byte is a character: no UTF-8 decoding cost
    opts.never_capture = True                    # captures would push RE2 off its DFA
    opts.log_errors = False
    opts.max_mem = 64 << 20
    return opts


@lru_cache(maxsize=4096)
def _line_program(pattern: str) -> str:
    return "%s(?:%s)" % (ENVELOPE_PATTERN, non_capturing(line_language(pattern)))


def _compile_re2(pattern: str):
    try:
        return re2.compile(pattern.encode("latin-1"), _re2_options())._regexp
    except (re2.error, UnicodeEncodeError) as exc:
        raise FilterCompileError(f"cannot compile {pattern[:120]!r}: {refusal(pattern, exc)}") from None


def _extractor(rule: FilterRule) -> FieldExtractor | None:
    try:
        extractor = FieldExtractor(rule.pattern, trusted=rule.trusted)
    except FieldError as exc:
        raise FilterCompileError(str(exc)) from None
    return extractor if extractor.fields else None


def _line_at(data: bytes, start: int, stop: int, index: int, from_end: int) -> bytes:
    """The index-th line of data[start:stop] (which holds whole lines), walking from the
    nearer end; from_end is the count of lines after it."""
    if index <= from_end:
        pos = start
        for _ in range(index):
            pos = data.index(b"\n", pos, stop) + 1
        return data[pos:data.index(b"\n", pos, stop)]
    end = stop - 1  # the newline ending the last line
    for _ in range(from_end):
        end = data.rindex(b"\n", start, end)
    return data[data.rfind(b"\n", start, end) + 1:end]


class FilterProgram:
    """A set of filter rules compiled once; shared, read-only, by every stream that uses it."""

    def __init__(self, rules: Sequence[FilterRule], guard: ErrorGuard | None = None):
        self.rules = list(rules)
        ids = [r.id for r in self.rules]
        if len(set(ids)) != len(ids):
            raise FilterCompileError("duplicate filter rule ids")
        self.guard = guard or ErrorGuard()
        self.line_patterns = [_line_program(r.pattern) for r in self.rules]
        # Each rule's run program is compiled when a stream first meets one of its lines
        # (run()): a short log meets a few of the rules, and compiling all ~70 was a tenth of
        # a 10-line diagnose's work after its imports. The set below compiles every line
        # pattern at once, so a pattern RE2 cannot run is still refused here, by its rule.
        self.runs: list = [None] * len(self.rules)
        self._line_set = self._compile_set() if self.rules else None
        self.extractors = [_extractor(r) for r in self.rules]
        # a line start followed by any rule's line: skips stretches that no rule knows
        self._any_line = _compile_re2("(?m)^(?:%s)\n" % "|".join(self.line_patterns)) if self.rules else None
        self._mixes: dict[tuple[int, ...], object] = {}

    def _compile_set(self):
        line_set = re2.Set(_ANCHOR_BOTH, _re2_options())
        for rule, pattern in zip(self.rules, self.line_patterns, strict=True):
            try:
                line_set.Add(pattern.encode("latin-1"))
            except (re2.error, UnicodeEncodeError) as exc:
                # named on the rule's own text: the composed program hides it. Asked only
                # when RE2 refuses (it refuses every feature that needs backtracking): the
                # check parses the pattern in Python, 2 ms a rule at every start
                feature = backtracking_feature(rule.pattern)
                if feature:
                    raise FilterCompileError(f"rule {rule.id} uses {feature}, which needs a backtracking engine; "
                                             "rules run in linear time (RE2)") from None
                raise FilterCompileError(f"cannot compile {pattern[:120]!r}: {refusal(pattern, exc)}") from None
        line_set.Compile()
        return line_set._set

    def run(self, k: int):
        """Rule k's run program `(?:ENVELOPE rule\n)+`, compiled on first use. One that RE2
        cannot build alone (beyond its memory, where the set could) matches nothing: the
        rule's lines are kept, never a stream's failure."""
        program = self.runs[k]
        if program is None:
            try:
                program = _compile_re2("(?:%s\n)+" % self.line_patterns[k])
            except FilterCompileError:
                program = _compile_re2("[^\\x00-\\xff]")
            self.runs[k] = program
        return program

    def mix(self, rules: tuple[int, ...]):
        """The mixed-run program `(?:(?:A|B)\n)+` of a few rules whose lines interleave at
        random, with each rule's required literal; None when one of them has no literal
        (its lines could not be counted), reads fields from every line, or RE2 cannot build
        the union."""
        if rules in self._mixes:
            return self._mixes[rules]
        mix = None
        literals = distinct_literals([line_language(self.rules[k].pattern) for k in rules])
        extractors = [self.extractors[k] for k in rules]
        if all(literals) and all(e is None or e.sampled for e in extractors):
            try:
                mix = (_compile_re2("(?:(?:%s)\n)+" % "|".join(self.line_patterns[k] for k in rules)), literals)
            except FilterCompileError:
                mix = None
        self._mixes[rules] = mix
        return mix

    def rules_matching(self, line: bytes | memoryview) -> list[int]:
        """Indexes of the rules whose pattern matches this line (without its newline)."""
        if self._line_set is None:
            return []
        return sorted(self._line_set.Match(line) or ())

    def next_known_line(self, data: bytes, pos: int, end: int) -> int:
        """Start of the first line in [pos, end) that some rule matches, else end."""
        if self._any_line is None or pos >= end:
            return end
        start = self._any_line.Match(_UNANCHORED, data, pos, end)[0][0]
        return end if start < 0 else start

    def block_program(self, period: tuple[tuple[int, int], ...]):
        parts = "".join("(?:%s\n){%d}" % (self.line_patterns[k], n) for k, n in period)
        return _compile_re2("(?:%s)+" % parts)


ProgressSink = Callable[[tuple[str, ...], list[int], Columns, Callable[[int], str]], None]
"""Receives a batch of progress values: field names, line numbers, one raw column per field,
and a function giving the text of one of those lines while the batch is read."""


class FilterStream:
    """Filters one source (a file or a live stream) and keeps its statistics.

    `feed()` takes buffers of whole lines (the ingest layer splits) and returns the kept
    lines; memory is bounded by the largest buffer, whatever the length of the log.
    """

    def __init__(self, program: FilterProgram, *, source: str = "", on_progress: ProgressSink | None = None,
                 sample_bytes: int = SAMPLE_BYTES, sample_after: int = SAMPLE_AFTER_BYTES):
        self.source = source
        self.sample_bytes = sample_bytes
        """Read dense metric lines at most once per this many bytes; 0 reads every one."""
        self.sample_after = sample_after
        """Every metric line of the first this many bytes is read (exact steps in small logs)."""
        self.lines_in = 0
        self.bytes_in = 0
        self.lines_kept = 0
        self._on_progress = on_progress or (lambda _fields, _numbers, _columns, _text: None)
        self._stats: dict[str, RuleStats] = {}
        self._use(program)

    # -- program changes -------------------------------------------------------------------
    def _use(self, program: FilterProgram) -> None:
        self.program = program
        n = len(program.rules)
        self._count = [0] * n
        self._first = [0] * n
        self._last = [0] * n
        self._succ = [-1] * n
        """Per rule, the rule whose run followed it last (tried first at the next run; -1:
        none yet). Only rules met in _run_at, whose run programs are compiled, are here."""
        self._second = [-1] * n
        """... and the one before that (tried second)."""
        self._blocks: OrderedDict[tuple, object] = OrderedDict()
        self._sampled_upto = [-1] * n
        """Per metric rule, the last sample interval read (-1: none; its first line is read)."""
        self._pending: dict[int, tuple[int, bytes, int, int, int, int]] = {}
        self._rows = _Rows()
        self._resume: dict[int, tuple] = {}
        """First rule of a period -> the period, for periods that consumed a block."""
        self._mix: tuple[int, ...] | None = None
        """Rules whose lines interleave at random here, consumed together (_mixed)."""
        self._mix_fails = 0
        self._mix_refused: set[tuple[int, ...]] = set()
        """Mixes whose literal counts did not add up here: their lines share a literal."""

    def _flush_stats(self) -> None:
        for k, rule in enumerate(self.program.rules):
            if self._count[k]:
                stats = self._stats.setdefault(rule.id, RuleStats())
                stats.merge(RuleStats(self._count[k], self._first[k], self._last[k]))
                self._count[k] = self._first[k] = self._last[k] = 0

    def __getstate__(self) -> dict:
        """Statistics and counters only: compiled programs are reattached with set_program()."""
        self._flush_stats()
        return {k: v for k, v in self.__dict__.items()
                if k not in ("program", "_count", "_first", "_last", "_succ", "_second", "_blocks", "_sampled_upto", "_pending", "_rows", "_resume", "_mix", "_mix_fails", "_mix_refused")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.program = None  # set_program() before the next feed()

    def set_program(self, program: FilterProgram) -> None:
        """Switch to a new rule set between two buffers; statistics carry over by rule id."""
        if self.program is not None:
            self._flush_stats()
        self._use(program)

    def rule_stats(self) -> dict[str, RuleStats]:
        if self.program is not None:
            self._flush_stats()
        return dict(self._stats)

    # -- the hot path ----------------------------------------------------------------------
    def feed(self, data: bytes) -> list[KeptLine]:
        """Filter a buffer of whole lines (it must end with a newline)."""
        if not data:
            return []
        if not data.endswith(b"\n"):
            raise ValueError("feed() needs whole lines: the buffer must end with a newline")
        kept: list[KeptLine] = []
        pos = 0
        spans = self.program.guard.error_line_spans(data)
        for i, (start, end) in enumerate(spans):
            if start < pos:
                continue  # kept already
            if pos < start:
                self._scan(data, pos, start, kept)
            self._keep(data, start, end, True, kept)
            pos = end
            if end < len(data) and data.find(_FRAME, start, end) >= 0 and (i + 1 == len(spans) or spans[i + 1][0] != end):
                # a traceback frame's source line (`    train_step(batch)`) says where the
                # failure happened: context, never dropped, whatever a filter rule says
                nl = data.find(b"\n", end)
                self._keep(data, end, nl + 1, False, kept)
                pos = nl + 1
        if pos < len(data):
            self._scan(data, pos, len(data), kept)
        self._flush_rows()
        if self._pending:
            self._flush_pending()
        self.bytes_in += len(data)
        self.lines_kept += len(kept)
        return kept

    def _keep(self, data: bytes, start: int, end: int, error_like: bool, kept: list[KeptLine]) -> None:
        self.lines_in += 1
        stop = min(end - 1, start + MAX_KEPT_LINE_CHARS)
        text = data[start:stop].decode("utf-8", "replace")
        kept.append(KeptLine(self.lines_in, text, error_like, self.source))

    def _keep_all(self, data: bytes, start: int, end: int, kept: list[KeptLine]) -> None:
        """Keep every line of [start, end): a stretch no rule knows."""
        first, source = self.lines_in + 1, self.source
        lines = data[start:end - 1].split(b"\n")
        kept.extend(KeptLine(first + i, line[:MAX_KEPT_LINE_CHARS].decode("utf-8", "replace"), False, source)
                    for i, line in enumerate(lines))
        self.lines_in += len(lines)

    def _scan(self, data: bytes, pos: int, end: int, kept: list[KeptLine]) -> None:
        """Consume [pos, end): whole lines, none of them error-like."""
        runs, succ, second = self.program.runs, self._succ, self._second
        count_nl = data.count
        history: list[tuple[int, int]] = []
        cur = backoff = wait = 0
        resume = self._resume
        while pos < end:
            if self._mix is not None:
                stop, last = self._mixed(self._mix, data, pos, end)
                if stop > pos:
                    cur, pos = last, stop
                    history.clear()
                    continue
            k = succ[cur] if succ else -1
            period = resume.get(k)
            if period is not None:
                # a periodic stretch that was interrupted (a checkpoint save, an evaluation)
                # usually picks up again where it left: try its block program first
                block = self._block_program(period)
                stop = block.Match(_ANCHOR_START, data, pos, end)[0][1] if block else -1
                if stop > pos:
                    self._record_block(period, sum(n for _, n in period), data, pos, stop)
                    cur = period[-1][0]
                    pos = stop
                    history.clear()
                    continue
            stop = runs[k].Match(_ANCHOR_START, data, pos, end)[0][1] if k >= 0 else -1
            if stop < 0 and second and (other := second[cur]) >= 0:
                # the rule that followed this one the time before: where two kinds of line
                # follow a rule in turn (a data line or a heartbeat after a step), one more
                # anchored match is cheaper than asking every rule (_run_at)
                stop = runs[other].Match(_ANCHOR_START, data, pos, end)[0][1]
                if stop >= 0:
                    k = other
            if stop < 0:
                k, stop = self._run_at(data, pos, end)
                if k < 0:
                    self._keep_all(data, pos, stop, kept)
                    pos = stop
                    history.clear()
                    continue
            n = count_nl(b"\n", pos, stop)
            self._record(k, n, data, pos, stop)
            if succ[cur] != k:
                second[cur] = succ[cur]
                succ[cur] = k
            cur = k
            pos = stop
            history.append((k, n))
            if len(history) >= 4:
                if wait:
                    wait -= 1
                    continue
                found = self._try_block(history, data, pos, end)
                if found == pos:
                    # no period here: a format that interleaves at random (helix's step lines
                    # between data lines) would pay for the search after every run, so the
                    # next searches wait 1, 3, 7 ... up to MAX_BLOCK_WAIT runs
                    backoff = min(2 * backoff + 1, MAX_BLOCK_WAIT)
                    wait = backoff
                    if backoff >= 2 ** MIX_AFTER_MISSES - 1 and self._mix is None:
                        self._start_mix(history)
                else:
                    backoff = wait = 0
                pos = found

    # -- random interleaving -----------------------------------------------------------------
    def _start_mix(self, history: list[tuple[int, int]]) -> None:
        # the rules of the last runs, the most frequent when there are more: a heartbeat
        # block's or a timer's run between the ones that take turns goes in the stretch too
        turns = Counter(k for k, _ in history[-2 * MAX_BLOCK_PERIOD:])
        rules = tuple(sorted(k for k, _ in turns.most_common(MAX_MIX_RULES)))
        if len(rules) >= 2 and rules not in self._mix_refused and self.program.mix(rules) is not None:
            self._mix, self._mix_fails = rules, 0

    def _mixed(self, rules: tuple[int, ...], data: bytes, pos: int, end: int) -> tuple[int, int]:
        """Consume the lines from pos on that belong to any of a few rules interleaving at
        random (helix's step lines between data lines at random: a run every line or two,
        each run one trip through the loop). Returns (stop, rule of the last line); stop is
        pos when nothing was consumed.

        The stretch is counted, not matched line by line: each rule's lines hold its
        required literal, so its count in the stretch is at least the rule's lines, and when
        the counts add up to the stretch's lines each line holds exactly one rule's literal,
        once, and the counts are exact (else the mix is dropped). A metric rule's sampling is
        what single runs would do: the stretch stops before the next sample point of any of
        its metric rules (the run that reaches it goes the usual way), and inside it only the
        last metric line is remembered; in the first SAMPLE_AFTER_BYTES, where every metric
        line is read, a mix with a metric rule consumes nothing.
        """
        program, literals = self.program.mix(rules)
        limit = end
        for k in rules:
            if self.program.extractors[k] is not None:
                if self.bytes_in < self.sample_after or self.sample_bytes <= 0:
                    return pos, -1
                limit = min(limit, (self._sampled_upto[k] + 1) * self.sample_bytes - self.bytes_in - 1)
        stop = program.Match(_ANCHOR_START, data, pos, limit)[0][1] if limit > pos else -1
        if stop <= pos:
            self._mix_fails += 1
            if self._mix_fails >= MAX_MIX_FAILS:
                self._mix = None
            return pos, -1
        counts = [data.count(literal, pos, stop) for literal in literals]
        # each rule's last line (and first, for a rule not met before), found by its literal
        marks: list[tuple[int, int, bool]] = []
        for k, literal, n in zip(rules, literals, counts, strict=True):
            if n:
                at = data.rfind(literal, pos, stop)
                marks.append((data.rfind(b"\n", pos, at) + 1 or pos, k, True))
                if not self._count[k]:
                    at = data.find(literal, pos, stop)
                    marks.append((data.rfind(b"\n", pos, at) + 1 or pos, k, False))
        marks.sort()
        # numbered by one pass over the stretch's newlines, the last stretch of it the total
        numbers, before, counted = [], 0, pos
        for start, _k, _is_last in marks:
            before += data.count(b"\n", counted, start)
            counted = start
            numbers.append(self.lines_in + before + 1)
        total = before + data.count(b"\n", counted, stop)
        if sum(counts) != total:
            self._mix = None
            self._mix_refused.add(rules)
            return pos, -1
        self._mix_fails = 0
        for k, n in zip(rules, counts, strict=True):
            self._count[k] += n
        for (start, k, is_last), number in zip(marks, numbers, strict=True):
            if not is_last:
                self._first[k] = number
                continue
            self._last[k] = number
            if self.program.extractors[k] is not None:
                self._pending[k] = (number, data, start, data.index(b"\n", start, stop) + 1, 0, 0)
        last = marks[-1][1]
        self.lines_in += total
        return stop, last

    def _run_at(self, data: bytes, pos: int, end: int) -> tuple[int, int]:
        """The rule matching the line at pos and the end of its run; or, when no rule matches
        that line, (-1, start of the next line that some rule matches)."""
        nl = data.find(b"\n", pos, end)
        eol = end if nl < 0 else nl + 1
        matching = self.program.rules_matching(memoryview(data)[pos:eol - 1])
        if not matching:
            return -1, self.program.next_known_line(data, eol, end)
        k = matching[0]
        stop = self.program.run(k).Match(_ANCHOR_START, data, pos, end)[0][1]
        return (k, stop) if stop > pos else (-1, eol)

    def _record(self, k: int, n: int, data: bytes, start: int, stop: int) -> None:
        first_line = self.lines_in + 1
        self.lines_in += n
        if not self._count[k]:
            self._first[k] = first_line
        self._count[k] += n
        self._last[k] = self.lines_in
        extractor = self.program.extractors[k]
        if extractor is None:
            return
        if (extractor.sampled and self.bytes_in >= self.sample_after and self.sample_bytes > 0
                and (self.bytes_in + stop) // self.sample_bytes == self._sampled_upto[k]):
            # _extract's most common answer (its own sampled-interval test, kept in step with
            # it), without its call: no sample point in this run, so only its last line is
            # remembered (a format that interleaves its metric lines with others at random
            # makes a run of every few lines: 110,000 in 91 MB of helix)
            self._pending[k] = (self.lines_in, data, start, stop, n - 1, 0)
            return
        self._extract(k, _Span(data, start, stop, n), first_line, n, 0, n)

    def _extract(self, k: int, span: _Span, first_line: int, lines_per: int, offset: int, n: int) -> None:
        """Read progress from rule k's lines in the span: in every period of `lines_per`
        lines, the `n` lines from `offset` on (a plain run is one period).

        Dense metric lines are sampled, at most one per SAMPLE_BYTES of log, and the last
        one of a run always: a Megatron job with --log-interval 1 prints an iteration line
        every few hundred bytes, and parsing each would cost more than the whole filter.
        A loss that jumps and does not come back, or turns NaN for good, still shows in the
        samples; a one-step blip that recovers is not a failure.
        """
        extractor = self.program.extractors[k]
        if not extractor.sampled or self.sample_bytes <= 0 or self.bytes_in < self.sample_after:
            self._extract_every_line(k, span, first_line, lines_per, offset, n)
            return
        self._flush_rows()
        # Sample points sit at fixed offsets of the log (every sample_bytes), not at a count
        # of bytes since the rule began: a rule learned mid-log then reads the same lines as
        # the same rule in force from the start, from its first run on (the first and the
        # second run of one log report the same progress).
        interval = (self.bytes_in + span.stop) // self.sample_bytes
        if interval == self._sampled_upto[k]:
            # not yet: remember the last line, read at the end of the buffer if still last
            # (its text is cut only when read: most are replaced by a later run first)
            total = span.total
            index = _last_in_period(total - 1, lines_per, offset, n)
            self._pending[k] = (first_line + index, span.data, span.start, span.stop, index, total - 1 - index)
            return
        samples = max(1, min(interval - self._sampled_upto[k], MAX_SAMPLES_PER_RUN))
        self._sampled_upto[k] = interval
        self._pending.pop(k, None)
        indexes, lines = _sampled_lines(span, samples, lines_per, offset, n)
        numbers, columns = extractor.columns_of(lines, [first_line + i for i in indexes])
        if numbers:
            texts = dict(zip((first_line + i for i in indexes), lines, strict=True))
            self._on_progress(extractor.fields, numbers, columns, lambda number: texts[number].decode("utf-8", "replace"))

    def _extract_every_line(self, k: int, span: _Span, first_line: int, lines_per: int, offset: int, n: int) -> None:
        extractor = self.program.extractors[k]
        data, start, stop, total = span.data, span.start, span.stop, span.total
        if lines_per == n:
            self._rows.add(k, data, start, stop, first_line, total)  # read with the buffer (_flush_rows)
            return
        self._flush_rows()  # a block's metric lines at fixed offsets of each period: read now, in order
        indexes = [p * lines_per + offset + j for p in range(total // lines_per) for j in range(n)]
        lines = _lines_at(data, start, stop, indexes)
        numbers, columns = extractor.columns_of(lines, [first_line + i for i in indexes])
        texts = dict(zip((first_line + i for i in indexes), lines, strict=True))

        def line_text(number: int) -> str:
            return texts[number].decode("utf-8", "replace")

        if numbers:
            self._on_progress(extractor.fields, numbers, columns, line_text)

    def _flush_rows(self) -> None:
        """Read the metric lines gathered by _Rows, one pass per rule: in a format that
        interleaves its metric lines with others (one line per run), reading each run alone
        cost more than the filter itself (60 us a run against 10 us a line)."""
        if not self._rows.batches:
            return
        for k, joined, numbers in self._rows.take():
            extractor = self.program.extractors[k]
            matched, columns = extractor.columns_joined(joined, numbers)
            if matched:
                self._on_progress(extractor.fields, matched, columns, _texts_of(joined, numbers))

    def _flush_pending(self) -> None:
        """Read the last metric line of each rule that sampling skipped: it is the newest."""
        for k, (number, data, start, stop, index, from_end) in sorted(self._pending.items()):
            line = _line_at(data, start, stop, index, from_end)
            extractor = self.program.extractors[k]
            numbers, columns = extractor.columns_of([line], [number])
            if numbers:
                self._on_progress(extractor.fields, numbers, columns, lambda _n, t=line: t.decode("utf-8", "replace"))
        self._pending.clear()

    # -- periodic interleaving ---------------------------------------------------------------
    def _try_block(self, history: list[tuple[int, int]], data: bytes, pos: int, end: int) -> int:
        """If the last runs repeat with a short period, consume as many periods as follow."""
        size = len(history)
        last = history[-1]
        for p in range(2, min(MAX_BLOCK_PERIOD, size // 2) + 1):
            # the cheap test first: a format that interleaves at random (a data loader's
            # line between step lines) repeats no period, and this runs after every run
            if history[-1 - p] != last or history[-p:] != history[-2 * p:-p]:
                continue
            period = tuple(history[-p:])
            lines_per = sum(n for _, n in period)
            if lines_per > MAX_BLOCK_LINES:
                return pos
            program = self._block_program(period)
            stop = program.Match(_ANCHOR_START, data, pos, end)[0][1] if program else -1
            history.clear()
            if stop > pos:
                self._record_block(period, lines_per, data, pos, stop)
                for turn in range(len(period)):  # it may pick up again at any of its rules
                    rotated = period[turn:] + period[:turn]
                    self._resume[rotated[0][0]] = rotated
                return stop
            return pos
        if size > 2 * MAX_BLOCK_PERIOD:
            del history[:-2 * MAX_BLOCK_PERIOD]
        return pos

    def _block_program(self, period: tuple[tuple[int, int], ...]):
        program = self._blocks.get(period)
        if program is None and period not in self._blocks:
            try:
                program = self.program.block_program(period)
            except FilterCompileError:
                program = None  # too big for RE2's budget: stay with single runs
            self._blocks[period] = program
            if len(self._blocks) > MAX_BLOCK_PROGRAMS:
                self._blocks.popitem(last=False)
        return program

    def _record_block(self, period, lines_per: int, data: bytes, start: int, stop: int) -> None:
        base = self.lines_in  # line number before the block
        span = _Span(data, start, stop)
        offset = 0
        for k, n in period:
            if self.program.extractors[k] is not None:
                # a metric rule's lines sit at fixed offsets within each period
                self._extract(k, span, base + 1, lines_per, offset, n)
            offset += n
        total = span.total  # after sampling, which counted the newlines up to its last line
        repeats = total // lines_per
        offset = 0
        for k, n in period:
            self._count[k] += repeats * n
            self._last[k] = max(self._last[k], base + (repeats - 1) * lines_per + offset + n)
            offset += n
        self.lines_in += total


def _last_in_period(index: int, lines_per: int, offset: int, n: int) -> int:
    """The last line at or before `index` that sits in [offset, offset + n) of its period."""
    r = index % lines_per
    if r >= offset + n:
        return index - (r - (offset + n - 1))
    if r < offset:
        return index - r - (lines_per - offset - n) - 1
    return index


def _lines_at(data: bytes, start: int, stop: int, indexes: Sequence[int]) -> list[bytes]:
    """The lines of data[start:stop] at the given increasing indexes (without newlines)."""
    out: list[bytes] = []
    pos, at = start, 0
    find = data.find
    for index in indexes:
        while at < index:
            pos = find(b"\n", pos, stop) + 1
            at += 1
        end = find(b"\n", pos, stop)
        out.append(data[pos:end])
    return out


class _Span:
    """data[start:stop], whole lines, with its newlines counted at most about once: counting
    up to increasing positions carries on from the last one, and the total from there."""

    __slots__ = ("data", "start", "stop", "_pos", "_lines", "_total")

    def __init__(self, data: bytes, start: int, stop: int, total: int | None = None):
        self.data, self.start, self.stop = data, start, stop
        self._pos, self._lines, self._total = start, 0, total

    def lines_before(self, pos: int) -> int:
        if pos < self._pos:  # asked out of order (a second metric rule in a block): recount
            self._pos, self._lines = self.start, 0
        self._lines += self.data.count(b"\n", self._pos, pos)
        self._pos = pos
        return self._lines

    @property
    def total(self) -> int:
        if self._total is None:
            self._total = self.lines_before(self.stop)
        return self._total


def _sampled_lines(span: _Span, samples: int, lines_per: int, offset: int,
                   n: int) -> tuple[list[int], list[bytes]]:
    """About `samples` of the span's metric lines, evenly spread by bytes, the last always:
    (their indexes in the span, their text). A sample point falls in some line; the metric
    line taken is the last one at or before it (in a block, the metric lines sit at known
    offsets of each period). Counting the newlines between sample points is the only pass
    over the bytes, and it is the one the block's own line count continues."""
    data, start, stop = span.data, span.start, span.stop
    rfind, find = data.rfind, data.find
    size = stop - start
    indexes: list[int] = []
    lines: list[bytes] = []
    for j in range(1, samples + 1):
        point = start + size * j // samples - 1
        line_start = max(start, rfind(b"\n", start, point) + 1)  # rfind gives -1 in the first line
        index = span.lines_before(line_start)
        target = _last_in_period(index, lines_per, offset, n)
        if target < 0 or (indexes and target <= indexes[-1]):
            continue
        for _ in range(index - target):
            line_start = max(start, rfind(b"\n", start, line_start - 1) + 1)
        indexes.append(target)
        lines.append(data[line_start:find(b"\n", line_start, stop)])
    return indexes, lines
