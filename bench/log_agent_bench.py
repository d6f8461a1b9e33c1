"""Log Agent benchmark: learning an unknown format, and what a hostile pattern costs ingestion.

For each generated unknown format (MaxText on multi-host TPU, the made-up "helix" trainer):

1. the agent (embedded backend, the default) sees the first 5% of the log, then is frozen;
2. the rest is fed with the rules it learned: the share of the remaining routine lines that
   are filtered, and how many of the error lines are kept (all of them, or it is a bug);
3. the number of learned rules against the number of distinct routine templates;
4. the same job resubmitted (new run id, date, pods/hosts) with its family's rules only.

Then the hostile-pattern figure: a textbook catastrophic pattern, `(a+)+$`-style, put into
the running stream as an untrusted rule *without* validation, on input built to make a
backtracking engine explode. In the hot path untrusted rules run only in RE2, so the
throughput must not move; validation's own cost on the same pattern is reported too.

    python -m bench.log_agent_bench [--steps-maxtext N] [--steps-helix N] [--repeat R]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from agents.log_agent import LogAgent, LogAgentConfig, MemorySink
from agents.validation import Validator
from fixtures.logs.unknown_formats import GeneratedLog, helix_log, maxtext_log
from rules.filters import FilterProgram, FilterStream
from rules.model import FilterRule
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook

CHUNK_LINES = 2000


def _feed(run: JobRun, log: GeneratedLog, start: int, stop: int) -> set[int]:
    kept: set[int] = set()
    for i in range(start, stop, CHUNK_LINES):
        block = log.lines[i:min(i + CHUNK_LINES, stop)]
        kept |= {k.line_number for k in run.feed("job.log", ("\n".join(block) + "\n").encode())}
    return kept


def _figures(log: GeneratedLog, kept: set[int], after: int) -> dict[str, float]:
    routine = [i for i in range(after, len(log.lines)) if log.kinds[i] == "routine"]
    errors = [i for i, k in enumerate(log.kinds) if k == "error"]
    return {"routine_filtered": sum(1 for i in routine if i + 1 not in kept) / max(1, len(routine)),
            "errors_kept": sum(1 for i in errors if i + 1 in kept), "errors": len(errors)}


class _Learned:
    def __init__(self, rules: Sequence[FilterRule]):
        self.rules = list(rules)

    def active_rules(self):
        return self.rules, []

    def version(self) -> int:
        return 1


def learn_format(name: str, first: GeneratedLog, again: GeneratedLog, rulebook: Rulebook) -> dict:
    sink = MemorySink()
    agent = LogAgent(LogAgentConfig(), sink=sink,
                     builtin_examples=[e for r in rulebook.filter_rules for e in r.examples],
                     evidence_examples=[e for r in rulebook.diagnosis_rules for e in r.examples])
    meta = JobMeta(name=first.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    cut = len(first.lines) // 20
    t0 = time.perf_counter()
    kept = _feed(run, first, 0, cut)
    run.add_filter_rules(run.log_agent.finish(run))  # the agent has seen the first 5%, no more
    learn_s = time.perf_counter() - t0
    run.log_agent = None
    t0 = time.perf_counter()
    kept |= _feed(run, first, cut, len(first.lines))
    rest_s = time.perf_counter() - t0
    result = {"format": name, "lines": len(first.lines), "learn_s": learn_s, "rest_s": rest_s,
              **_figures(first, kept, cut), "rules": len(run.learned),
              "templates": len({t for t in first.templates if t}),
              "templates_in_first_5pct": len({t for t in first.templates[:cut] if t})}
    book = Rulebook(builtin_filters=rulebook.filter_rules, builtin_diagnosis=rulebook.diagnosis_rules,
                    source=_Learned([r for r, status, _ in sink.rules.values() if status == "active"]))
    resub = JobRun(book, JobMeta(name=again.name))
    kept2 = _feed(resub, again, 0, len(again.lines))
    fig2 = _figures(again, kept2, 0)
    result.update(resubmitted_name=again.name, resub_routine_filtered=fig2["routine_filtered"],
                  resub_errors_kept=fig2["errors_kept"], resub_errors=fig2["errors"])
    return result


HOSTILE = r"(a+)+$"
HOSTILE_LINE = "a" * 40 + "!"


def hostile(rulebook: Rulebook, log: GeneratedLog, repeat: int) -> dict:
    """Throughput of the filter on a log salted with adversarial lines, with and without a
    catastrophic untrusted rule in force (it never went through validation)."""
    lines = list(log.lines)
    for i in range(0, len(lines), 10):
        lines.insert(i, HOSTILE_LINE)
    data = ("\n".join(lines) + "\n").encode()
    base_rules = list(rulebook.filter_rules)
    # same number of rules on both sides: a benign untrusted rule, or the hostile one
    plain = FilterProgram([*base_rules, FilterRule("benign", r"b+ benign", source="log_agent:test", trusted=False)],
                          rulebook.guard)
    salted = FilterProgram([*base_rules, FilterRule("hostile", HOSTILE, source="log_agent:test", trusted=False)],
                           rulebook.guard)

    def rate(program: FilterProgram) -> float:
        best = 0.0
        for _ in range(repeat):
            stream = FilterStream(program)
            t0 = time.perf_counter()
            for start in range(0, len(data), 1 << 20):
                end = data.find(b"\n", min(start + (1 << 20), len(data)) - 1)
                stream.feed(data[start:end + 1] if end >= 0 else data[start:])
            best = max(best, len(data) / (time.perf_counter() - t0) / 1e6)
        return best

    validator = Validator(guard=rulebook.guard, corpus=[])
    t0 = time.perf_counter()
    validation = validator.validate(HOSTILE, segment=[HOSTILE_LINE] * 5, claims=range(5))
    validate_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    timed = validator._bounded_time(HOSTILE.replace("(a+)+", "(a|a)+"), _tree("(a|a)+"), [HOSTILE_LINE], [0])
    timing_ms = (time.perf_counter() - t0) * 1000
    matched = sum(1 for line in lines if line == HOSTILE_LINE)
    return {"mb": len(data) / 1e6, "without_mb_s": rate(plain), "with_mb_s": rate(salted),
            "hostile_lines": matched, "validation": validation.failed, "validate_ms": validate_ms,
            "timed_ok": timed.ok, "timed_detail": timed.detail, "timing_ms": timing_ms}


def _tree(pattern: str):
    import re._parser as sre_parse  # noqa: PLC2701

    return sre_parse.parse(pattern)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-maxtext", type=int, default=8000)
    parser.add_argument("--steps-helix", type=int, default=60000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rulebook = Rulebook()
    runs = [
        learn_format("maxtext (multi-host TPU, xpk)", maxtext_log(steps=args.steps_maxtext, workers=8, seed=101),
                     maxtext_log(steps=args.steps_maxtext, workers=8, seed=102), rulebook),
        learn_format("helix (made-up trainer, pdsh)", helix_log(steps=args.steps_helix, nodes=4, seed=101),
                     helix_log(steps=args.steps_helix, nodes=4, seed=102), rulebook),
    ]
    out = ["Log Agent (embedded backend, K=5) on formats no built-in pack covers",
           f"{'format':<32}{'lines':>9}{'filtered after 5%':>19}{'errors kept':>13}{'rules':>7}"
           f"{'templates':>11}{'resubmitted: filtered':>23}{'errors kept':>13}"]
    for r in runs:
        out.append(f"{r['format']:<32}{r['lines']:>9,}{r['routine_filtered']:>18.2%} "
                   f"{r['errors_kept']:>6}/{r['errors']:<5}{r['rules']:>7}{r['templates']:>11}"
                   f"{r['resub_routine_filtered']:>22.2%} {r['resub_errors_kept']:>6}/{r['resub_errors']:<5}")
    for r in runs:
        out.append(f"  {r['format']}: learning on the first 5% took {r['learn_s']:.2f} s "
                   f"({r['templates_in_first_5pct']} of {r['templates']} templates appear in it); "
                   f"the remaining 95% took {r['rest_s']:.2f} s")
    h = hostile(rulebook, maxtext_log(steps=2000, workers=8, seed=103), args.repeat)
    out += ["", f"Hostile pattern {HOSTILE!r} forced into the hot path (no validation), "
                f"{h['mb']:.1f} MB with {h['hostile_lines']:,} adversarial lines:",
            f"  filter throughput with a benign untrusted rule {h['without_mb_s']:,.0f} MB/s, "
            f"with the hostile one {h['with_mb_s']:,.0f} MB/s (best of {args.repeat}; RE2 is linear time)",
            f"  validation rejects it ({', '.join(h['validation'])}: nested quantifier) in {h['validate_ms']:.1f} ms",
            f"  (a|a)+$ (no nesting) meets the timed regex check: "
            f"{'passed' if h['timed_ok'] else 'rejected: ' + h['timed_detail']} in {h['timing_ms']:.0f} ms"]
    print("\n".join(out))  # noqa: T201 - a benchmark's report


if __name__ == "__main__":
    main()
