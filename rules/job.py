"""One job's diagnosis, from raw line buffers to the Diagnosis: the stages wired together.

ingest (line buffers) -> filter (per source) -> redact kept lines -> Log Agent (may add
filter rules, applied to the running streams) -> classifier -> at finish: root-cause
choice, loss spikes and hangs from progress, Failure Agent when the rules are not sure.
This module does no I/O itself; callers (CLI, HTTP, live jobs) bring the bytes.
"""

from __future__ import annotations

import functools
import math
import pickle
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from rules.classifier import Classifier, DiagnosisProgram, RuleEvidence
from rules.envelope import bare_message
from rules.extract import FieldError, FieldExtractor
from rules.family import job_family
from rules.linear import NotLinear, compile_linear
from rules.model import FilterRule, KeptLine, Tier
from rules.progress import ProgressTracker
from rules.timestamps import TimestampReader
from rules.verdict import Diagnosis, Facts, RootCauseView, decide, from_hang, needs_agent
from rules.interrupt import is_interrupt, line_before
from rules.redact import Redactor, redact_text
from rules.rulebook import Rulebook

HANG_FLOOR_S = 30 * 60
HANG_STEP_FACTOR = 20
COMPRESSED_HEAD_LINES = 2_000
COMPRESSED_TAIL_LINES = 20_000
FORWARDED_TRACKED = 100_000
AGENT_SLICE_BYTES = 64 << 10
AGENT_MAX_SLICE_BYTES = 64 << 20
AGENT_BUSY_LINES = 16
"""Unexplained kept lines in a slice that mean the agent still has work: keep slices small."""
TAIL_LINES = 256
"""Raw lines remembered per source: enough to hold, behind a final traceback, the periodic
stamped lines (PULSE, keep-alives) that show a hang."""
SURVIVED_STEPS = 3
"""New training steps after a rule's last match, in the same file, from which the job went
on past it (a retried connection, a warning a rule knows, an elastic restart): the match is
listed among the other errors, not the root cause. One or two steps can still be printed by
a rank that has not yet blocked on the rank that died; three cannot."""
_TRAINS_THROUGH = frozenset({"loss_spike"})
"""Reasons whose evidence is the training's own metrics: training goes on through them."""
SNAPSHOT_FORMAT = 1
_TRANSIENT = frozenset({"rulebook", "filter_program", "log_agent", "failure_agent", "_batch", "_flagged"})
_EXCEPTION_LINE = re.compile(r"(?:^|[\s:\]])([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): ")
_TRACEBACK = "Traceback (most recent call last)"
_STACK_FRAME = re.compile(r'File "[^"\n]*", line \d+')
"""A Python stack frame. Frames with no exception after them are a stack dump of a live
process (py-spy, gdb's py-bt, faulthandler): taken because it hung, not an error of its own."""
_BARE_EXCEPTION = re.compile(r"\s*(?:[A-Za-z_]\w*\.)+[A-Z][a-z]+[A-Za-z0-9]*: \S")
"""A Python exception line with a dotted module path, whatever the class is called."""
_BARE_EXCEPTION_HINT = re.compile(r"\w\.[A-Z][a-z]+[A-Za-z0-9]*: ")
"""Its shape anywhere in the raw line: one search settles most kept lines before the
envelope is split off."""


def _bare_exception(text: str) -> bool:
    return _BARE_EXCEPTION_HINT.search(text) is not None and _BARE_EXCEPTION.match(bare_message(text)) is not None
_FATAL = re.compile(
    r"(?i)\b(?:error|fatal|exception|failed|failure|abort(?:ed)?|killed|died|crashed|panic|segmentation fault"
    r"|core dumped)\b"
    r"|\bexit ?code\W+-?[1-9]|\bexit status -?[1-9]|\bexited with (?:exit )?code -?[1-9]|\bsig(?:kill|term|bus|segv|abrt)\b")
"""A line that says something stopped: an error, a fatal message, a signal, a non-zero exit.
Such a line after the last progress of its file means the job failed, even when no rule
knows its words (DESIGN: never silent)."""
_SIGKILL = re.compile(r"\bexitcode\s*:\s*-9\b|\(exitcode: -9\)|Signal 9 \(SIGKILL\)|\bSIGKILL\b"
                      r"|\bexit(?:ed with)? (?:exit )?(?:code|status)\W{0,2}137\b|^\W*Killed\s*$"
                      r"|\bexits with return code = -9\b|\bexited on signal 9\b")
"""A process killed with signal 9 (exit -9, or 137 from a shell): nothing inside it could
say why, because SIGKILL cannot be caught. DeepSpeed's launcher says `... exits with return
code = -9` (launcher/launch.py), Open MPI's `mpirun` `... exited on signal 9 (Killed)`."""
_SIGBUS = re.compile(r"\bexitcode\s*:\s*-7\b|\(exitcode: -7\)|Signal 7 \(SIGBUS\)")
"""A process killed by SIGBUS (exit -7): in training, a write to shared memory (/dev/shm) that
had run out, which no Python code sees coming (pytorch#5247)."""
_BOX_ROOT = "Root Cause (first observed failure)"
_LAUNCHER_EXCEPTION = re.compile(r"ChildFailedError|torch\.distributed\.elastic")
"""torchrun's own report that a worker failed: a consequence, not the worker's exception."""
_NOT_FATAL = re.compile(r"\b[A-Z]\w*Warning\b|^\W*(?:WARNING|WARN|W\d{4})\b|\[W\d{3,4} |(?<!NCCL )\bWARN(?:ING)?\b"
                        r"|\bwarning\b|\b(?:no|0|zero) (?:errors?|failures?)\b|\b(?:error|fail)[\w.]*\s*[:=]\s*0\b"
                        r"|\bNCCL INFO\b")
"""Warnings, and counters of errors that are zero: lines that went on working. NCCL's own
`NCCL WARN` lines are how it reports its errors, so they are not warnings here; its `NCCL
INFO` lines never are errors (`comm ... - Abort COMPLETE` is each rank's teardown at exit)."""
_NCCL_INFO = "NCCL INFO"


@dataclass(frozen=True)
class JobMeta:
    name: str = ""
    framework: str | None = None
    tags: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        """The job's family: a `family:<x>` tag, else its name without run ids and dates."""
        for tag in self.tags:
            if tag.startswith("family:") and tag[7:].strip():
                return tag[7:].strip().lower()
        return job_family(self.name)


_NOT_A_HOST = re.compile(
    r"(?i)(?:[a-z]+[-_])?(?:rank|local[-_]?rank|node[-_]?rank|worker|proc|process|pid|gpu|cuda|device|dev|task|"
    r"part|shard|log|logs|stdout|stderr|out|err|output|train|training|run|job|attempt|trial|try|retry|step|"
    r"epoch|iter|default|console)[-_.]?\d+(?:[-_.]\w+)?")
"""File stems that number a process or an attempt, not a machine: `rank2`, `worker-3`,
`train_0`, `stdout-1`, `job_7_rank0`; a node is named by the log's own words then."""


@functools.lru_cache(maxsize=8)
def node_file_matcher(pattern: str):
    """The configured file-name pattern, compiled (RE2); ValueError when it does not compile
    or has no `node` group (the setting names it: FAULTLINE_NODE_FILE_PATTERN)."""
    try:
        compiled = compile_linear(pattern)
    except NotLinear as exc:
        raise ValueError(f"FAULTLINE_NODE_FILE_PATTERN: {exc}") from None
    if "node" not in compiled.groupindex:
        raise ValueError("FAULTLINE_NODE_FILE_PATTERN needs a group named node, e.g. (?P<node>gpu-\\d+)\\.log$")
    return compiled


class JobView:
    """What an agent sees of a running job, read-only, and the one thing it may do to it:
    hand lines it judges error-like to the classifier. Agents are typed against this, not
    against JobRun, so the run's internals can change without touching them."""

    __slots__ = ("_run",)

    def __init__(self, run: JobRun):
        self._run = run

    @property
    def meta(self) -> JobMeta:
        return self._run.meta

    def kept_lines(self) -> list[KeptLine]:
        """The compressed log: its bounded head, error lines and tail."""
        return self._run.compressed.lines()

    @property
    def found(self) -> Mapping[str, RuleEvidence]:
        """What the diagnosis rules found so far, by rule id."""
        return self._run.classifier.found

    @property
    def diagnosis_program(self) -> DiagnosisProgram:
        return self._run.classifier.program

    def default_node(self, source: str) -> str | None:
        """The node a source stands for (a file named like a host), if any."""
        return self._run.classifier.default_nodes.get(source)

    def last_checkpoint_step(self) -> int | None:
        primary = self._run.primary_progress()
        checkpoints = primary.progress.checkpoints if primary else ()
        return checkpoints[-1].step if checkpoints else None

    def forward_error_lines(self, lines: Iterable[KeptLine]) -> None:
        self._run.forward_error_lines(lines)

    def forwarded(self, line: KeptLine) -> bool:
        """Whether the line is error-like only because an agent forwarded it: no error
        pattern matched its own words."""
        return (line.source, line.line_number) in self._run._forwarded  # noqa: SLF001 - the view's own run


class LogAgentHook(Protocol):
    def observe(self, job: JobView, kept: list[KeptLine]) -> list[FilterRule]:
        """See kept lines; return filter rules accepted for this job (may be empty).
        May call `job.forward_error_lines()` for lines it judges error-like."""

    def finish(self, job: JobView) -> list[FilterRule]:
        """The log ended: learn from what is left; rules returned count as learned."""


class FailureAgentHook(Protocol):
    def diagnose(self, job: JobView, diagnosis: Diagnosis) -> Diagnosis | None:
        """A better diagnosis than the rules', or None."""


@dataclass
class SourceRun:
    name: str
    stream: object
    progress: ProgressTracker
    redactor: Redactor = field(default_factory=Redactor)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    """The last raw lines seen (kept or not), for the time the log ends at and the time that
    passed after the last progress line."""
    tail_redactor: Redactor = field(default_factory=Redactor)
    """Redacts the tail; follows every line of the source, so a private key block that
    began earlier is still masked."""


class CompressedLog:
    """What a person or an agent reads instead of the log: bounded head, error lines, tail."""

    def __init__(self, head: int = COMPRESSED_HEAD_LINES, tail: int = COMPRESSED_TAIL_LINES):
        self.head: list[KeptLine] = []
        self.tail: deque[KeptLine] = deque(maxlen=tail)
        self._head_max = head
        self.total = 0

    def add(self, lines: Iterable[KeptLine]) -> None:
        for line in lines:
            self.total += 1
            if len(self.head) < self._head_max:
                self.head.append(line)
            else:
                self.tail.append(line)

    def lines(self) -> list[KeptLine]:
        return [*self.head, *self.tail]


class JobRun:
    """Diagnoses one job whose log arrives as whole-line buffers from one or more sources."""

    def __init__(self, rulebook: Rulebook, meta: JobMeta = JobMeta(), *,
                 log_agent: LogAgentHook | None = None, failure_agent: FailureAgentHook | None = None,
                 compressed: CompressedLog | None = None, node_files: str = ""):
        self.rulebook = rulebook
        if node_files:
            node_file_matcher(node_files)  # a bad pattern fails here, not at the second file
        self.node_files = node_files
        """Which file names stand for nodes (`node_file_matcher`); empty: the default heuristics.
        Kept as text: a run is pickled between a live job's appends."""
        self.meta = meta
        self.filter_program = rulebook.filter_program(meta.framework, meta.name, family=meta.family)
        self.classifier = Classifier(rulebook.diagnosis_program)
        self.sources: dict[str, SourceRun] = {}
        self.compressed = compressed or CompressedLog()
        self.log_agent = log_agent
        self.failure_agent = failure_agent
        self.learned: list[FilterRule] = []
        self.suggested: list[dict] = []
        self.bytes_in = 0
        self.lines_cut = 0
        """Lines longer than the ingest limit: their head was kept, the rest skipped."""
        self._last_exception: KeptLine | None = None
        self._last_error_like: KeptLine | None = None
        self._frame_before: dict[str, bool] = {}
        self._fatal: dict[str, tuple[int, KeptLine]] = {}
        self._killed: KeptLine | None = None
        """The line that says a process was killed with SIGKILL (see `_prefer`)."""
        self._bus_error: KeptLine | None = None
        """The same for SIGBUS."""
        self._box_root_at: dict[str, int] = {}
        """Per source, the line of torchrun's "Root Cause (first observed failure)" header."""
        self._interrupted: tuple[str, int, str] | None = None
        """The last line before the first interrupt by hand (Ctrl+C): (text, number, source)."""
        self._own_exception = False
        """An exception of the job's own code was seen (not the launcher's report of it)."""
        """Per source: the first fatal-looking line after that source's latest progress line."""
        self._saw_traceback = False
        self._slice = AGENT_SLICE_BYTES
        self._learned_in_feed = False
        self._batch: set[tuple[str, int]] = set()
        self._flagged: set[tuple[str, int]] = set()
        self._forwarded: set[tuple[str, int]] = set()

    def view(self) -> JobView:
        """The narrow, read-only view of this run that the agents get."""
        return JobView(self)

    # -- feeding -----------------------------------------------------------------------------
    def source(self, name: str) -> SourceRun:
        run = self.sources.get(name)
        if run is None:
            tracker = ProgressTracker(name)
            stream = self.rulebook.stream(self.filter_program, source=name, on_progress=tracker.observe)
            run = self.sources[name] = SourceRun(name, stream, tracker)
            if len(self.sources) == 2:  # from the second file on, files may stand for nodes
                for each in self.sources:
                    self._name_node(each)
            elif len(self.sources) > 2:
                self._name_node(name)  # the others are named already: linear in the files
        return run

    def _name_node(self, name: str) -> None:
        """One file per node: with a configured pattern, a file whose name it matches stands
        for the node its `node` group reads; without, a file named like a host does, one
        named for a rank, a worker or an attempt (`rank2.log`, `worker-3.out`) does not."""
        if self.node_files:
            m = node_file_matcher(self.node_files).search(name)
            if m is not None and m.group("node"):
                self.classifier.default_nodes[name] = m.group("node")
            return
        stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
        if re.fullmatch(r"[A-Za-z][\w-]*\d[\w-]*", stem) and not _NOT_A_HOST.fullmatch(stem):
            self.classifier.default_nodes[name] = stem

    def feed(self, source: str, buffer: bytes, *, raw_bytes: int | None = None) -> list[KeptLine]:
        """Filter one buffer of whole lines; returns the kept lines, redacted.

        With a Log Agent, a large buffer is fed in slices while the agent is learning: a rule
        learned from the start of an 8 MB ingest buffer then filters the rest of it, not only
        the next buffer. While the rules in force leave little for the agent, slices grow
        back to whole buffers, because each filter call has a fixed cost.
        """
        if self.log_agent is None or len(buffer) <= self._slice:
            return self._feed(source, buffer, raw_bytes=raw_bytes)
        kept: list[KeptLine] = []
        start = 0
        while start < len(buffer):
            end = buffer.find(b"\n", min(start + self._slice, len(buffer)) - 1)
            end = len(buffer) if end < 0 else end + 1
            part = self._feed(source, buffer[start:end], raw_bytes=raw_bytes if start == 0 else 0)
            kept += part
            learning = sum(not k.error_like for k in part) >= AGENT_BUSY_LINES or self._learned_in_feed
            self._slice = AGENT_SLICE_BYTES if learning else min(self._slice * 4, AGENT_MAX_SLICE_BYTES)
            start = end
        return kept

    def feed_kept(self, kept: Iterable[KeptLine]) -> None:
        """Feed a job's stored kept lines again (a replay with other rules), one buffer per
        consecutive stretch of one source."""
        batch: list[str] = []
        current = None
        for line in kept:
            if line.source != current and batch:
                self.feed(current, ("\n".join(batch) + "\n").encode("utf-8"))
                batch = []
            current = line.source
            batch.append(line.text)
        if batch:
            self.feed(current, ("\n".join(batch) + "\n").encode("utf-8"))

    def _feed(self, source: str, buffer: bytes, *, raw_bytes: int | None = None) -> list[KeptLine]:
        # whether this slice taught the agent something: a slice that keeps nothing taught
        # nothing (left as it was, one learning slice kept every later slice at 64 KB)
        self._learned_in_feed = False
        run = self.source(source)
        self.bytes_in += len(buffer) if raw_bytes is None else raw_bytes
        first_line = run.stream.lines_in
        raw = run.stream.feed(buffer)
        if self._interrupted is None:
            self._look_for_interrupt(run, buffer, first_line, raw)
        texts = run.redactor.redact_many([k.text for k in raw])
        kept = [k if k.text is t else KeptLine(k.line_number, t, k.error_like, source)
                for k, t in zip(raw, texts, strict=True)]
        self._remember_tail(run, buffer)
        if self.log_agent is not None and kept:
            self._batch = {(k.source, k.line_number) for k in kept}
            learned = self.log_agent.observe(self.view(), kept)
            self._learned_in_feed = bool(learned)
            if learned:
                self.add_filter_rules(learned)
                self._read_kept_checkpoints(learned, kept)
            if self._flagged:
                kept = [replace(k, error_like=True) if (k.source, k.line_number) in self._flagged else k
                        for k in kept]
                self._flagged.clear()
            self._batch = set()
        for i, line in enumerate(kept):
            if not line.error_like and self._saw_traceback and _bare_exception(line.text):
                # the last line of a traceback, for an exception whose name says nothing of
                # an error (`storage.client.QuorumLost: ...`): it is the failure itself
                line = kept[i] = replace(line, error_like=True)
            self._classify(line)
        run.progress.flush_kept()
        self.compressed.add(kept)
        return kept

    def _look_for_interrupt(self, run: SourceRun, buffer: bytes, first_line: int, kept: list[KeptLine]) -> None:
        """Where someone pressed Ctrl+C (rules.interrupt): the line before it is where the
        job sat, read from the raw buffer (it is often routine output a filter rule drops)."""
        mark = next((k for k in kept if k.error_like and is_interrupt(k.text)), None)
        if mark is None:
            return
        found = line_before(buffer, mark.line_number - first_line - 1)
        if found is not None:
            text, index = found
            self._interrupted = (redact_text(text.decode("utf-8", "replace")), first_line + index + 1, run.name)
            return
        # the interrupt opens the buffer: the line before it ended the previous one
        for back, text in enumerate(reversed(run.tail)):
            if bare_message(text).strip():
                self._interrupted = (text, first_line - back, run.name)
                return

    def _remember_tail(self, run: SourceRun, buffer: bytes) -> None:
        start = len(buffer) - 1
        for _ in range(run.tail.maxlen or TAIL_LINES):
            start = buffer.rfind(b"\n", 0, start)
            if start < 0:
                break
        # raw lines (kept or not) end up in a live job's stored state: redacted too, in one
        # pass over the tail (a live append's fixed cost: per line, it was a third of it)
        redactor = run.tail_redactor
        if start > 0 and (redactor.in_key or buffer.find(b"PRIVATE KEY", 0, start) >= 0):  # no copy of the buffer
            for line in buffer[:start].decode("utf-8", "replace").splitlines():
                redactor.redact(line)  # a key block opens or closes before the tail: follow it
        run.tail.extend(redactor.redact_many(buffer[start + 1:].decode("utf-8", "replace").splitlines()))

    def _classify(self, line: KeptLine) -> None:
        """Error lines go to the classifier; other kept lines only matter as chain markers
        and as the failure box's rank-to-host lines."""
        if "host" in line.text or "local_rank" in line.text or "NODELIST" in line.text:
            # the failure box's rank-to-host lines (error-like for the guard, so no filter
            # drops them; a name, not an error, for the classifier), a banner's node list
            self.classifier.learn_placement(line)
        run = self.sources.get(line.source)
        if run is not None:
            # a loss in a format no filter rule reads yet (the Log Agent may also have
            # forwarded the line as an error: a NaN loss is both); rules.sniff prefilters
            run.progress.observe_kept(line.line_number, line.text)
        if not line.error_like:
            if "above exception" in line.text:
                self.classifier.feed(line)
            return
        self.classifier.feed(line)
        frame = _STACK_FRAME.search(line.text) is not None
        if (not frame and not self._frame_before.get(line.source, False)
                and (line.source, line.line_number) not in self._forwarded and _NCCL_INFO not in line.text):
            # error-like by its own words: not a frame's source line (it follows the frame),
            # not a line the Log Agent forwarded, whose judgement depends on what it has
            # learned before (the same log would end on another line the second time), not
            # NCCL's INFO (its teardown says `Abort COMPLETE`); a retried timeout's warning is
            # a lead (a storage client's read timeouts), so warnings stay
            self._last_error_like = line
        self._frame_before[line.source] = frame
        if _TRACEBACK in line.text:
            self._saw_traceback = True
        elif _EXCEPTION_LINE.search(line.text) or _bare_exception(line.text):
            self._last_exception = line
            self._own_exception |= not _LAUNCHER_EXCEPTION.search(line.text)
        if _BOX_ROOT in line.text:
            self._box_root_at.setdefault(line.source, line.line_number)
        if _SIGKILL.search(line.text) and self._prefer(line, self._killed):
            self._killed = line
        if _SIGBUS.search(line.text) and self._prefer(line, self._bus_error):
            self._bus_error = line
        if _FATAL.search(line.text) and not _NOT_FATAL.search(line.text):
            held = self._fatal.get(line.source)
            if held is None or held[1].line_number < self._progress_line(line.source):
                self._fatal[line.source] = (self.classifier.seq, line)

    def _prefer(self, line: KeptLine, held: KeptLine | None) -> bool:
        """Take `line` as the signal's evidence over `held`: nothing held yet, or `line` is in
        torchrun's "Root Cause (first observed failure)" section and `held` (from the list of
        other failures printed above it) is not, or names the signal where `held` gave only
        the exit code."""
        if held is None:
            return True
        at = self._box_root_at.get(line.source)
        if at is None or line.line_number < at:
            return False
        held_at = self._box_root_at.get(held.source)
        if held_at is None or held.line_number < held_at:
            return True
        # both in that section: the line naming the signal says more than the exit code
        return "Signal " in line.text and "Signal " not in held.text

    def _flush_progress(self, source: str) -> SourceRun | None:
        """The source's run, with the losses sniffed from its lines so far read."""
        run = self.sources.get(source)
        if run is not None:
            run.progress.flush_kept()
        return run

    def _progress_line(self, source: str) -> int:
        run = self._flush_progress(source)  # the points of this buffer's lines before this one
        last = run.progress.last_line if run is not None else None
        return last[0] if last else 0

    def fatal_line(self) -> KeptLine | None:
        """The first fatal-looking line that no progress followed in its file, if any: the
        earliest in time is the best guess of a cause when no rule knows the words."""
        held = [(seq, line) for source, (seq, line) in self._fatal.items()
                if line.line_number > self._progress_line(source)]
        return min(held, key=lambda item: item[0])[1] if held else None

    def forward_error_lines(self, lines: Iterable[KeptLine]) -> None:
        """Lines the Log Agent judges error-like go to the classifier: those of the buffer being
        fed in their place, earlier ones at once."""
        for line in lines:
            key = (line.source, line.line_number)
            if line.error_like or key in self._forwarded:
                continue
            if len(self._forwarded) < FORWARDED_TRACKED:
                self._forwarded.add(key)
            if key in self._batch:
                self._flagged.add(key)
            else:
                self._classify(replace(line, error_like=True))
                self._flush_progress(line.source)  # an earlier line, of any source: read now

    def add_filter_rules(self, rules: list[FilterRule]) -> None:
        """New filter rules take effect on the running streams, from the next buffer on."""
        self.learned.extend(rules)
        self.filter_program = self.rulebook.extend(self.filter_program, rules)
        for run in self.sources.values():
            run.stream.set_program(self.filter_program)

    def _read_kept_checkpoints(self, rules: list[FilterRule], pending: Iterable[KeptLine] = ()) -> None:
        """A learned rule that reads checkpoint saves reads the ones this run kept before it
        was learned (`pending`: the buffer being fed, not yet in the compressed log). The
        second run of the same log has the rule in force from its first line and reads them
        all; without this the first would report no checkpoint, or an older one (a 2.4 MB
        MaxText log: none, then step 2500). Same log, same diagnosis."""
        readers = []
        for rule in rules:
            try:
                reader = FieldExtractor(rule.pattern, trusted=rule.trusted)
            except FieldError:
                continue
            if "checkpoint_step" in reader.fields:
                readers.append(reader)
        if not readers:
            return
        lines = [*self.compressed.lines(), *pending]
        for name, run in self.sources.items():
            mine = [line for line in lines if line.source == name]
            texts = [line.text.encode("utf-8", "replace") for line in mine]
            for reader in readers:
                numbers, columns = reader.columns_of(texts, [line.line_number for line in mine])
                if numbers:
                    run.progress.add_checkpoints(numbers, columns[reader.fields.index("checkpoint_step")])

    # -- live jobs: state between appends --------------------------------------------------------
    def snapshot(self) -> bytes:
        """The job's processing state, without compiled programs and agents (see restore).

        Pickle, because the state is a graph of our own dataclasses, arrays and deques that
        changes as the pipeline grows; the bytes only ever come from this method and live in
        our own database, which is trusted like the code itself. A format number guards
        against restoring the state of an incompatible version.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in _TRANSIENT}
        return pickle.dumps({"format": SNAPSHOT_FORMAT, "state": state}, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def restore(cls, blob: bytes, rulebook: Rulebook, *, log_agent: LogAgentHook | None = None,
                failure_agent: FailureAgentHook | None = None) -> JobRun:
        """A JobRun from snapshot() bytes, with the rules in force now reattached."""
        data = pickle.loads(blob)  # noqa: S301 - our own bytes, see snapshot()
        if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
            raise ValueError("job state of another format version")
        run = cls.__new__(cls)
        run.__dict__.update(data["state"])
        run.__dict__.setdefault("_last_error_like", None)  # a job that began before these were tracked
        run.__dict__.setdefault("_frame_before", {})
        run.__dict__.setdefault("_bus_error", None)
        run.__dict__.setdefault("_box_root_at", {})
        run.__dict__.setdefault("_interrupted", None)
        run.rulebook, run.log_agent, run.failure_agent = rulebook, log_agent, failure_agent
        run._batch, run._flagged = set(), set()
        program = rulebook.filter_program(run.meta.framework, run.meta.name, family=run.meta.family)
        run.filter_program = rulebook.extend(program, run.learned) if run.learned else program
        run.classifier.program = rulebook.diagnosis_program
        for source in run.sources.values():
            source.stream.set_program(run.filter_program)
            if "tail_redactor" not in source.__dict__:  # the state of a job that began before it existed
                source.tail_redactor = Redactor()
        return run

    def current(self) -> Diagnosis:
        """The diagnosis so far, while the job runs (no agent is asked, nothing is final)."""
        return self._rule_diagnosis()

    # -- the verdict -------------------------------------------------------------------------
    def finish(self) -> Diagnosis:
        if self.log_agent is not None:
            learned = self.log_agent.finish(self.view())
            self.learned.extend(learned)
            self._read_kept_checkpoints(learned)
        for run in self.sources.values():
            run.progress.spikes.finish()
        diagnosis = self._rule_diagnosis(ended=True)
        if self.failure_agent is not None and needs_agent(diagnosis):
            better = self.failure_agent.diagnose(self.view(), diagnosis)
            if better is not None:
                diagnosis = better
        diagnosis.suggested_rules = [*self.suggested, *diagnosis.suggested_rules]
        return diagnosis

    def primary_progress(self) -> SourceRun | None:
        runs = [r for r in self.sources.values() if r.progress.points_seen]
        return max(runs, key=lambda r: (r.progress.last_step or 0, r.progress.points_seen)) if runs else None

    def _last_line(self) -> tuple[str, int, str] | None:
        """The last non-blank line of the log (of the source that printed most), redacted."""
        run = max(self.sources.values(), key=lambda r: r.stream.lines_in, default=None)
        if run is None:
            return None
        for back, text in enumerate(reversed(run.tail)):
            if bare_message(text).strip():  # a collector stamps blank lines too
                return text, run.stream.lines_in - back, run.name
        return None

    def _rule_diagnosis(self, *, ended: bool = False) -> Diagnosis:
        """The rules' verdict (`rules.verdict.decide`) on what this run has seen so far;
        `ended`: the log is whole (a finished upload or job), not a live job's lines so far."""
        primary = self.primary_progress()
        fatal = self.fatal_line()
        survived = self.survived()
        traced = self._saw_traceback or self._last_exception is not None or self._launcher_saw_failure(survived)
        return decide(Facts(
            found=self.classifier.found, survived=survived,
            spike=primary.progress.spikes.failed if primary else None,
            checkpoints=list(primary.progress.checkpoints) if primary else [],
            progress_source=primary.name if primary else None, hang=lambda: self._hang(primary),
            node_of=self.classifier.node_of, traceback=self._saw_traceback, failure_traced=traced,
            # never silent: a traceback with no exception line the job recognises (a paste cut
            # short, an odd wording) still has the error-like line it printed last
            failure_line=self._last_exception or fatal or self._last_error_like,
            fatal=fatal is not None, killed_line=None if self._own_exception else self._killed,
            bus_error_line=None if self._own_exception else self._bus_error,
            completed=self.completed(), progress=self.progress_summary(),
            stopped=self._last_line if ended else lambda: None,
            interrupted=self._interrupted,
            last_error_like=self._last_error_like if ended else None,
            compression=self.compression_summary(), filtered=self.filtered_summary()))

    def _launcher_saw_failure(self, survived: frozenset[str]) -> bool:
        """A launcher or a crash left its trace (a non-zero exit in srun's summary or the
        torchrun box, a C++ stack): something failed, even when no error names itself
        (a shell's `Permission denied`, a missing script)."""
        return any(found.rule.tier is Tier.CONTEXT and rule_id not in survived
                   for rule_id, found in self.classifier.found.items())

    def survived(self) -> frozenset[str]:
        """Diagnosis rules whose every match the job trained on past (SURVIVED_STEPS new steps
        after the last one, in the same file): not what ended it."""
        out = set()
        for rule_id, found in self.classifier.found.items():
            last = found.latest
            if last is None or found.rule.reason in _TRAINS_THROUGH:
                continue
            run = self.sources.get(last.source)
            if run is not None and run.progress.steps_after(last.line_number) >= SURVIVED_STEPS:
                out.add(rule_id)
        return frozenset(out)

    def completed(self) -> bool:
        done = self.rulebook.completion_rule_ids
        return any(rule_id in done for run in self.sources.values() for rule_id in run.stream.rule_stats())

    def _hang(self, primary: SourceRun | None) -> tuple[RootCauseView, str] | None:
        """Post-hoc hang: the log goes on (time stamps) long after the last progress line."""
        if primary is None or primary.progress.last_line is None:
            return None
        line_number, text = primary.progress.last_line
        clock = TimestampReader()
        progress_at = clock.read(text)
        if progress_at is None:
            # The progress line carries no time stamp (HF Trainer's metrics dict, NeMo's
            # progress line): the lines printed after it do, and the time they span is a
            # lower bound of the silence.
            first = primary.stream.lines_in - len(primary.tail) + 1
            after = [t for number, raw in enumerate(primary.tail, first) if number > line_number
                     for t in (clock.read(raw),) if t is not None]
            if len(after) < 2:
                return None
            progress_at, ends_at = min(after), max(after)
        else:
            # the end of the log: its last lines, or the last error line with a time stamp (a
            # traceback's frames at the very end carry none)
            ends_at = max((t for r in self.sources.values() for t in map(clock.read, r.tail) if t is not None),
                          default=None)
            errors_end = self.classifier.latest_time()
            if errors_end is not None and (ends_at is None or errors_end > ends_at):
                ends_at = errors_end
        if ends_at is None:
            return None
        step_time = primary.progress.summary().get("last_step_time_s") or 0.0
        threshold = max(HANG_FLOOR_S, HANG_STEP_FACTOR * float(step_time))
        silent = ends_at - progress_at
        if silent < threshold:
            return None
        return from_hang(text, line_number, primary.name, silent)

    # -- summaries ---------------------------------------------------------------------------
    def loss_curve(self, max_points: int = 160) -> list[list[float]]:
        """[step, loss] pairs of the primary source, at most max_points (evenly thinned,
        the last point kept): enough for a small plot of a stored job."""
        primary = self.primary_progress()
        if primary is None:
            return []
        points = [[p.step, round(p.loss, 6)] for p in primary.progress.curve()
                  if p.step is not None and p.loss is not None and math.isfinite(p.loss)]
        if len(points) > max_points:
            stride = len(points) / max_points
            points = [points[int(i * stride)] for i in range(max_points - 1)] + [points[-1]]
        return points

    def progress_summary(self) -> dict:
        primary = self.primary_progress()
        if primary is None:
            return {"last_step": None, "last_loss": None}
        summary = primary.progress.summary()
        checkpoints = primary.progress.checkpoints
        summary["last_checkpoint_step"] = checkpoints[-1].step if checkpoints else None
        summary["points"] = primary.progress.points_seen
        return summary

    def compression_summary(self) -> dict:
        lines_in = sum(r.stream.lines_in for r in self.sources.values())
        kept = sum(r.stream.lines_kept for r in self.sources.values())
        return {"lines_in": lines_in, "lines_kept": kept, "bytes_in": self.bytes_in,
                "rules_learned": len(self.learned), "lines_cut": self.lines_cut}

    def filtered_summary(self) -> list[dict]:
        totals: dict[str, dict] = {}
        for run in self.sources.values():
            for rule_id, stats in run.stream.rule_stats().items():
                entry = totals.setdefault(rule_id, {"rule": rule_id, "count": 0, "first_line": None,
                                                    "last_line": None, "files": 0})
                entry["count"] += stats.count
                entry["files"] += 1
                if entry["first_line"] is None or len(self.sources) == 1:
                    entry["first_line"], entry["last_line"] = stats.first_line, stats.last_line
        return sorted(totals.values(), key=lambda e: -e["count"])
