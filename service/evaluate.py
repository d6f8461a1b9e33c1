"""`faultline eval DIR`: how often `diagnose` is right on a folder of labelled logs.

The folder holds `labels.jsonl` (DESIGN.md, "Labelled logs"): one object per log with the
file, its reason, category, origin and the root-cause line. Each log is diagnosed as
`faultline diagnose` would, on a fresh temporary store (what one log teaches the agents
never reaches the next, and the user's store is never written), and scored beside two naive
baselines on the same logs: the first error line, and the last exception line, each
classified by the exception type it names. A diagnosis that beats neither is not worth
having.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rules.classifier import holes
from rules.taxonomy import is_reason, reason
from service.errors import BadInput

LABEL_FIELDS = ("file", "reason", "category", "origin", "root_cause_line")
ORIGINS = ("infrastructure", "user", "training", "unknown")

_ERROR_WORDS = re.compile(r"(?i)error|exception|fatal|traceback|failed|killed")
_EXCEPTION = re.compile(r"\b((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure))\b")
_BY_EXCEPTION = {
    "KeyError": "key_error", "AttributeError": "attribute_error", "ValueError": "value_error",
    "TypeError": "type_error", "NameError": "name_error", "UnboundLocalError": "name_error",
    "IndexError": "index_error", "ImportError": "import_error", "ModuleNotFoundError": "import_error",
    "FileNotFoundError": "file_not_found_error", "PermissionError": "permission_error",
    "OSError": "os_error", "IOError": "os_error", "SyntaxError": "syntax_error",
    "IndentationError": "syntax_error", "AssertionError": "assertion_error",
    "ZeroDivisionError": "zero_division_error", "CalledProcessError": "called_process_error",
    "OutOfMemoryError": "out_of_memory", "RuntimeError": "runtime_error",
    "ConnectionError": "connection_error", "ConnectionRefusedError": "connection_error",
    "ConnectionResetError": "connection_error", "TimeoutError": "connection_error",
    "DistBackendError": "nccl_remote_error", "DistStoreError": "connection_error",
    "RendezvousConnectionError": "connection_error", "CUDAError": "cuda_error",
}


@dataclass(frozen=True)
class Label:
    """A labelled log; `reason` None means no root cause is expected (a healthy or a running
    job: `status` says which)."""
    file: str
    reason: str | None
    category: str | None
    origin: str | None
    root_cause_line: str | None
    status: str = "failed"
    hard: bool = False
    split: str | None = None
    source: str | None = None
    confirmed: bool | None = None
    """The thread confirmed the cause (COLLECTING.md); None when the label does not say."""


@dataclass
class Guess:
    """One answer for one log: ours or a baseline's."""
    reason: str | None
    origin: str | None
    line: str | None
    status: str | None = None
    source: str | None = None
    """What named it (`rule:<id>`, `retrieval`, `evidence:<signal>`): ours only."""
    mitigation: str = ""
    """Ours only."""


@dataclass
class Scored:
    label: Label
    ours: Guess
    first_error: Guess
    last_exception: Guess
    seconds: float
    error: str | None = None

    def right(self, guess: Guess) -> dict[str, bool]:
        label = self.label
        if label.reason is None:  # nothing wrong: right only when nothing is named
            ok = guess.line is None and guess.status in (None, label.status)
            return {"reason": ok, "origin": ok, "line": ok}
        return {"reason": guess.reason == label.reason, "origin": guess.origin == label.origin,
                "line": guess.line is not None and label.root_cause_line in guess.line}


@dataclass
class Report:
    logs: int = 0
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    """`ours`, `first_error`, `last_exception` -> reason, origin, line, hard_reason, silent."""
    per_reason: dict[str, dict[str, int]] = field(default_factory=dict)
    origin_confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    hard: int = 0
    origin_known: int = 0
    """Logs whose origin the thread settled (origin is scored on these)."""
    confirmed: int = 0
    """Logs whose thread confirmed the cause; `confirmed_figures` are the figures on these
    alone (reason, origin, line; per answer), where a label is least open to doubt."""
    confirmed_figures: dict[str, dict[str, float]] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    seconds_per_log: float = 0.0
    mistakes: list[dict[str, Any]] = field(default_factory=list)
    unfilled: list[dict[str, Any]] = field(default_factory=list)
    """Logs whose mitigation shows a hole where a value belongs (`rules.classifier.holes`)."""
    withheld_folds: int = 0
    """Scored in this many folds, each with its own logs withheld from the knowledge base
    (0: none of the logs was in it; see `run_eval`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- labels ----------------------------------------------------------------------------------------
def load_labels(folder: Path, split: str | None = None) -> list[Label]:
    """The labelled logs of a folder; a bad label is an error that names its line."""
    path = folder / "labels.jsonl"
    if not path.is_file():
        raise BadInput(f"{folder}: no labels.jsonl (one JSON object per log: {', '.join(LABEL_FIELDS)})")
    labels = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}:{number}: not JSON ({exc.msg})") from None
        missing = [k for k in LABEL_FIELDS if k not in item]
        if missing:
            raise BadInput(f"{path}:{number}: missing {', '.join(missing)}")
        status = item.get("status") or "failed"
        if item["reason"] is None and status == "failed":
            raise BadInput(f"{path}:{number}: a failed log needs a reason")
        if item["reason"] is not None:
            if not is_reason(item["reason"]):
                raise BadInput(f"{path}:{number}: unknown reason {item['reason']!r}")
            if item["origin"] not in ORIGINS:
                raise BadInput(f"{path}:{number}: origin must be one of {', '.join(ORIGINS)}")
            if not item["root_cause_line"]:
                raise BadInput(f"{path}:{number}: root_cause_line is empty")
        if not (folder / item["file"]).is_file():
            raise BadInput(f"{path}:{number}: no file {item['file']}")
        if split is not None and item.get("split") != split:
            continue
        labels.append(Label(file=item["file"], reason=item["reason"], category=item.get("category"),
                            origin=item["origin"], root_cause_line=item["root_cause_line"], status=status,
                            hard=bool(item.get("hard")), split=item.get("split"), source=item.get("source"),
                            confirmed=item.get("confirmed")))
    if not labels:
        raise BadInput(f"{path}: no labelled logs" + (f" in split {split!r}" if split else ""))
    return labels


# -- the naive baselines ---------------------------------------------------------------------------
def _classified(line: str | None) -> Guess:
    """What a person grepping would conclude from one line: the exception type it names."""
    if line is None:
        return Guess(None, None, None)
    names = [m.group(1).rsplit(".", 1)[-1] for m in _EXCEPTION.finditer(line)]
    reason_id = next((_BY_EXCEPTION[n] for n in names if n in _BY_EXCEPTION), "unknown")
    return Guess(reason_id, reason(reason_id).origin.value, line)


def baselines(lines: Iterable[str]) -> tuple[Guess, Guess]:
    """(first error line, last exception line) of a log, each classified by its exception."""
    first = last = None
    for line in lines:
        if first is None and _ERROR_WORDS.search(line):
            first = line
        if _EXCEPTION.search(line):
            last = line
    return _classified(first), _classified(last)


# -- scoring -----------------------------------------------------------------------------------------
def score(results: Sequence[Scored]) -> Report:
    report = Report(logs=len(results), hard=sum(r.label.hard for r in results),
                    origin_known=sum(r.label.origin != "unknown" for r in results))
    sure = [r for r in results if r.label.confirmed]
    report.confirmed = len(sure)
    for name in ("ours", "first_error", "last_exception"):
        report.figures[name] = _figures(results, name)
        if sure:
            report.confirmed_figures[name] = {k: v for k, v in _figures(sure, name).items()
                                              if k in ("reason", "origin", "line")}
    predicted = Counter(r.ours.reason or (r.ours.status if r.label.reason is None else None) for r in results)
    for r in results:
        row = report.per_reason.setdefault(r.label.reason or r.label.status, {"logs": 0, "right": 0, "predicted": 0})
        row["logs"] += 1
        row["right"] += r.right(r.ours)["reason"]
        confusion = report.origin_confusion.setdefault(r.label.origin or "none", {})
        confusion[r.ours.origin or "none"] = confusion.get(r.ours.origin or "none", 0) + 1
        if r.ours.line is None and r.label.reason is not None:
            report.silent.append(r.label.file)
        if found := holes(r.ours.mitigation):
            report.unfilled.append({"file": r.label.file, "holes": found})
        ok = r.right(r.ours)
        if not all(ok.values()):
            report.mistakes.append({"file": r.label.file, "want": [r.label.reason, r.label.origin],
                                    "got": [r.ours.reason, r.ours.origin, r.ours.status],
                                    "named_by": r.ours.source, "line_right": ok["line"], "error": r.error})
    for reason_id, count in predicted.items():
        report.per_reason.setdefault(reason_id or "none", {"logs": 0, "right": 0, "predicted": 0})["predicted"] = count
    report.seconds_per_log = round(sum(r.seconds for r in results) / max(len(results), 1), 3)
    return report


def _figures(results: Sequence[Scored], name: str) -> dict[str, float]:
    """One answer's (`ours` or a baseline's) shares of right reasons, origins and lines, of
    right reasons on the hard logs, and of silent logs."""
    rights = [r.right(getattr(r, name)) for r in results]
    hard = [ok for r, ok in zip(results, rights, strict=True) if r.label.hard]
    return {
        "reason": _share(ok["reason"] for ok in rights),
        # a thread that never said whose fault it was cannot score an origin
        "origin": _share(ok["origin"] for r, ok in zip(results, rights, strict=True) if r.label.origin != "unknown"),
        "line": _share(ok["line"] for ok in rights),
        "hard_reason": _share(ok["reason"] for ok in hard) if hard else 0.0,
        "silent": _share(getattr(r, name).line is None for r in results if r.label.reason is not None),
    }


def _rows(figures: dict[str, dict[str, float]], titles: Sequence[tuple[str, str]]) -> list[str]:
    """One table row per figure: ours, then the two baselines."""
    return [f"{title:26}{figures['ours'][key]:>11.2f}{figures['first_error'][key]:>13.2f}"
            f"{figures['last_exception'][key]:>16.2f}" for key, title in titles]


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return round(sum(flags) / len(flags), 3) if flags else 0.0


def render(report: Report) -> str:
    """The table for a person (README shows it for the real corpus's test split)."""
    f = report.figures
    out = [f"{report.logs} labelled logs ({report.hard} hard, {report.origin_known} with a known origin), "
           f"{report.seconds_per_log:.2f} s per log"]
    if report.withheld_folds:
        out.append(f"(these logs' own lines seed the knowledge base: scored in {report.withheld_folds} folds, "
                   "each with its own lines withheld)")
    out += ["", f"{'':26}{'faultline':>11}{'first error':>13}{'last exception':>16}"]
    titles = (("reason", "reason right"), ("origin", "origin right"), ("line", "root-cause line found"),
              ("hard_reason", "hard cases: reason right"), ("silent", "silent (no root cause)"))
    out += _rows(f, titles)
    if report.confirmed_figures:
        out += ["", f"the {report.confirmed} logs whose thread confirmed the cause:"]
        out += _rows(report.confirmed_figures, titles[:3])
    out += ["", f"{'reason':24}{'logs':>6}{'right':>7}{'named':>7}"]
    for reason_id, row in sorted(report.per_reason.items(), key=lambda kv: (-kv[1]["logs"], kv[0])):
        out.append(f"{reason_id:24}{row['logs']:>6}{row['right']:>7}{row['predicted']:>7}")
    out += ["", "origin (labelled -> diagnosed): " + "; ".join(
        f"{want}: " + ", ".join(f"{got} {n}" for got, n in sorted(row.items(), key=lambda kv: -kv[1]))
        for want, row in sorted(report.origin_confusion.items()))]
    if report.silent:
        out.append(f"silent: {', '.join(report.silent)}")
    if report.unfilled:
        out.append("mitigation with a hole: " + ", ".join(f"{u['file']} ({' '.join(u['holes'])})" for u in report.unfilled))
    return "\n".join(out) + "\n"


# -- running diagnose over the folder ----------------------------------------------------------------
def evaluate(folder: Path, labels: Sequence[Label], diagnose: Callable[[Path], dict[str, Any]], *,
             on_progress: Callable[[int, int], None] | None = None) -> list[Scored]:
    """Diagnose each labelled log with `diagnose` (a path in, the contract's JSON out);
    `on_progress(done, total)` after each."""
    results = []
    for label in labels:
        path = folder / label.file
        first, last = baselines(path.read_text(encoding="utf-8", errors="replace").splitlines())
        started = time.perf_counter()
        error = None
        try:
            d = diagnose(path)
        except Exception as exc:  # noqa: BLE001 - one bad log is a mistake in the table, not the end of the run
            d, error = {}, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - started
        root = d.get("root_cause") or {}
        ours = Guess(root.get("reason"), root.get("origin"), root.get("line"), d.get("status"), root.get("source"),
                     d.get("mitigation") or "")
        results.append(Scored(label, ours, first, last, seconds, error))
        if on_progress is not None:
            on_progress(len(results), len(labels))
    return results


FOLDS = 2
"""Logs whose own root-cause lines are in the Failure Agent's knowledge (the corpus's `dev`
split) are scored in this many folds, each with its own logs' lines withheld."""


def _fold(source: str | None) -> int:
    return int(hashlib.sha256((source or "").encode()).hexdigest(), 16) % FOLDS


def run_eval(folder: Path, *, split: str | None, settings_overrides: dict[str, Any] | None = None,
             embedder: object | None = None, on_progress: Callable[[int, int], None] | None = None) -> Report:
    """Score `diagnose` with the settings in force, on a fresh store in a temporary folder
    (`embedder` lets a caller that has the model loaded share it).

    A log is never its own nearest neighbour: when scored logs are among the real incidents
    the embedded knowledge base is seeded with (the `dev` split), they are scored in FOLDS
    folds by a hash of their source, each fold's own lines withheld from the knowledge, so
    the figure says what a new log of the same kind would get."""
    from agents.embeddings import LazyEmbedder
    from agents.knowledge import load_real_incidents
    from agents.vector_store import load_minilm

    labels = load_labels(folder, split)
    known = {item.get("source") for item in load_real_incidents()} - {None}
    overlap = any(label.source in known for label in labels)
    folds = [[label for label in labels if _fold(label.source) == k] for k in range(FOLDS)] if overlap else [labels]
    embedder = embedder or LazyEmbedder(load_minilm)  # one model for every fold
    results: list[Scored] = []
    for part in folds:
        def progress(done: int, _total: int, before: int = len(results)) -> None:
            if on_progress is not None:
                on_progress(before + done, len(labels))

        withheld = frozenset(label.source for label in part if label.source)  # none is known when not overlap
        results += _score_part(folder, part, settings_overrides, embedder, withheld, progress)
    order = {label.file: n for n, label in enumerate(labels)}
    report = score(sorted(results, key=lambda r: order[r.label.file]))
    report.withheld_folds = len(folds) if overlap else 0
    return report


def _score_part(folder: Path, labels: Sequence[Label], settings_overrides: dict[str, Any] | None,
                embedder: object, withheld: frozenset[str], on_progress: Callable[[int, int], None]) -> list[Scored]:
    """Diagnose `labels` on one fresh store whose knowledge leaves out `withheld` sources."""
    from rules.job import JobMeta
    from service.context import Context
    from service.ingest.sources import feed_path
    from service.settings import load_settings

    with tempfile.TemporaryDirectory(prefix="faultline-eval-") as tmp:
        settings = load_settings(data_dir=Path(tmp), database_url="", **(settings_overrides or {}))
        with Context.open(settings, embedder=embedder, withheld_sources=withheld) as ctx:
            def diagnose(path: Path) -> dict[str, Any]:
                run = ctx.new_run(JobMeta())
                feed_path(run, str(path))
                return run.finish().to_dict()

            return evaluate(folder, labels, diagnose, on_progress=on_progress)
