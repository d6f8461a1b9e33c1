"""The filter engine against a plain reference: Python `re`, one line at a time."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rules.envelope import ENVELOPE_PATTERN
from rules.filters import FilterCompileError, FilterProgram, FilterStream, _sampled_lines, _Span
from rules.guard import ErrorGuard
from rules.model import FilterRule
from rules.progress import ProgressTracker

GUARD = ErrorGuard()

# Disjoint rules, so attribution is unambiguous and must be exact.
RULES = [
    FilterRule("nccl.info", r"[\w.-]+:\d+:\d+ \[\d+\] NCCL INFO .*"),
    FilterRule("megatron.iteration",
               r" ?(?:\[[\d :-]+\] )?iteration +(?P<step>\d+)/ *\d+ \|.*lm loss: (?P<loss>[\d.E+-]+) \|.*"),
    FilterRule("megatron.timers-header", r"\(min, max\) time across ranks \(ms\):"),
    FilterRule("megatron.timer", r" {4}[\w-]+ \.+: \([\d.]+, [\d.]+\)"),
    FilterRule("checkpoint.saved", r"  successfully saved checkpoint from iteration +(?P<checkpoint_step>\d+) to \S+.*"),
]


def line_for(kind: str, rnd: random.Random, step: int) -> str:
    rank = rnd.randrange(8)
    if kind == "nccl":
        return f"[default{rank}]:node-{rnd.randrange(4)}:{1000 + rank}:{2000 + rank} [{rank}] NCCL INFO Channel {rnd.randrange(32):02d}/32 :    0   1"
    if kind == "iter":
        return (f"[default7]: [2025-03-31 05:54:07] iteration {step:8d}/  242204 | consumed samples: {step * 8:12d} | "
                f"lm loss: {2 + rnd.random():.6E} | grad norm: {rnd.random():.3f} |")
    if kind == "header":
        return "[default0]:(min, max) time across ranks (ms):"
    if kind == "timer":
        name = rnd.choice(["forward-backward", "optimizer", "batch-generator"])
        return f"[default0]:    {name} {'.' * (48 - len(name))}: ({rnd.random() * 100:.2f}, {rnd.random() * 100:.2f})"
    if kind == "ckpt":
        return f"[default0]:  successfully saved checkpoint from iteration {step:7d} to /ckpt/run [ t 1/1, p 1/1 ]"
    if kind == "error":
        return f"[default{rank}]:[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered"
    if kind == "error_in_rule":  # matches the NCCL rule, but is an error: must be kept
        return f"[default{rank}]:node-1:1001:2001 [{rank}] NCCL INFO NET/IB : Got completion with error 12, opcode 0"
    return f"[default{rank}]:some unknown chatter {rnd.randrange(10**6)} from module {rnd.choice('abcdef')}"


def make_log(seed: int, steps: int = 300) -> list[str]:
    """Periodic step blocks with bursts, unknown lines and errors in between."""
    rnd = random.Random(seed)
    lines: list[str] = []
    timers = rnd.randint(1, 5)
    for step in range(1, steps + 1):
        lines.append(line_for("iter", rnd, step))
        lines.append(line_for("header", rnd, step))
        lines.extend(line_for("timer", rnd, step) for _ in range(timers))
        roll = rnd.random()
        if roll < 0.05:
            lines.extend(line_for("nccl", rnd, step) for _ in range(rnd.randint(1, 40)))
        elif roll < 0.08:
            lines.append(line_for(rnd.choice(["error", "error_in_rule", "unknown"]), rnd, step))
        elif roll < 0.1:
            lines.append(line_for("ckpt", rnd, step))
    return lines


def reference(lines: list[str]) -> tuple[list[int], dict[str, tuple[int, int, int]]]:
    """(kept line numbers, {rule: (count, first, last)}) computed the slow, obvious way."""
    compiled = [(r.id, re.compile(f"{ENVELOPE_PATTERN}(?:{r.pattern})")) for r in RULES]
    kept: list[int] = []
    stats: dict[str, tuple[int, int, int]] = {}
    for number, line in enumerate(lines, 1):
        if GUARD.is_error_like(line):
            kept.append(number)
            continue
        rule = next((rid for rid, rx in compiled if rx.fullmatch(line)), None)
        if rule is None:
            kept.append(number)
            continue
        count, first, _ = stats.get(rule, (0, number, number))
        stats[rule] = (count + 1, first, number)
    return kept, stats


def run_engine(lines: list[str], cuts: list[int], rules=RULES, sample_bytes: int = 0, sample_after: int = 0):
    data = ("\n".join(lines) + "\n").encode()
    tracker = ProgressTracker()
    stream = FilterStream(FilterProgram(rules, GUARD), on_progress=tracker.observe, sample_bytes=sample_bytes,
                          sample_after=sample_after)
    kept = []
    bounds = sorted({0, len(data), *(data.rfind(b"\n", 0, c) + 1 for c in cuts)})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        if start < stop:
            kept.extend(stream.feed(data[start:stop]))
    return kept, stream, tracker


@pytest.mark.parametrize("seed", range(6))
def test_engine_matches_reference_exactly(seed: int) -> None:
    lines = make_log(seed)
    rnd = random.Random(seed)
    cuts = [rnd.randrange(1, 200_000) for _ in range(rnd.randint(0, 8))]
    kept, stream, _ = run_engine(lines, cuts)
    want_kept, want_stats = reference(lines)
    assert [k.line_number for k in kept] == want_kept
    assert [k.text for k in kept] == [lines[n - 1] for n in want_kept]
    got = {rid: (s.count, s.first_line, s.last_line) for rid, s in stream.rule_stats().items()}
    assert got == want_stats
    assert stream.lines_in == len(lines)


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from(["nccl", "iter", "header", "timer", "ckpt", "error", "error_in_rule", "unknown"]),
                      min_size=1, max_size=120),
       cuts=st.lists(st.integers(min_value=1, max_value=20_000), max_size=5))
def test_any_sequence_any_buffer_split(kinds: list[str], cuts: list[int]) -> None:
    rnd = random.Random(len(kinds))
    lines = [line_for(kind, rnd, i) for i, kind in enumerate(kinds, 1)]
    kept, stream, _ = run_engine(lines, cuts)
    want_kept, want_stats = reference(lines)
    assert [k.line_number for k in kept] == want_kept
    got = {rid: (s.count, s.first_line, s.last_line) for rid, s in stream.rule_stats().items()}
    assert got == want_stats


def test_error_like_line_is_never_dropped_even_when_a_rule_matches_it() -> None:
    lines = ["[default0]:node-1:1:1 [0] NCCL INFO Bootstrap : Using ib0",
             "[default0]:node-1:1:1 [0] NCCL INFO NET/IB : Got completion from peer 10.0.0.2 with error 12",
             "[default0]:node-1:1:1 [0] NCCL INFO Connected all rings"]
    kept, stream, _ = run_engine(lines, [])
    assert [k.line_number for k in kept] == [2]
    assert kept[0].error_like
    assert stream.rule_stats()["nccl.info"].count == 2


def test_a_rule_written_to_drop_everything_still_keeps_errors() -> None:
    lines = ["step 1 ok", "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
             "KeyError: 'lr'", "step 2 ok"]
    kept, stream, _ = run_engine(lines, [], rules=[FilterRule("everything", ".*", trusted=False)])
    assert [k.text for k in kept] == lines[1:4]
    assert stream.rule_stats()["everything"].count == 2


def test_progress_fields_are_read_from_dropped_lines() -> None:
    lines = make_log(3, steps=200)
    _, _, tracker = run_engine(lines, [50_000])
    curve = tracker.curve()
    assert [p.step for p in curve] == list(range(1, 201))
    assert all(2.0 <= p.loss < 3.0 for p in curve)
    iteration_lines = [n for n, line in enumerate(lines, 1) if "] iteration " in line]
    assert [p.line_number for p in curve] == iteration_lines
    saved = [c.step for c in tracker.checkpoints]
    assert saved == [int(line.split("iteration")[1].split()[0]) for line in lines if "saved checkpoint" in line]


@pytest.mark.parametrize("seed", range(4))
def test_dense_metric_lines_are_sampled_and_the_last_one_is_always_read(seed: int) -> None:
    lines = make_log(seed, steps=3000)
    size = sum(len(line) + 1 for line in lines)
    every = {n: line for n, line in enumerate(lines, 1) if "] iteration " in line}
    _, _, tracker = run_engine(lines, [size // 3, size // 2], sample_bytes=4096)
    curve = tracker.curve()
    numbers = [p.line_number for p in curve]
    assert numbers == sorted(set(numbers)) and set(numbers) <= set(every)
    assert numbers[-1] == max(every), "the newest point is never skipped"
    assert len(curve) <= size // 4096 + 8, "at most one point per sample_bytes, plus one per buffer"
    assert len(curve) >= size // 4096 // 2
    for point in curve:  # a sampled value is the value on its own line
        assert f"iteration {point.step:8d}/" in every[point.line_number]
    assert [c.step for c in tracker.checkpoints] == \
        [int(line.split("iteration")[1].split()[0]) for line in lines if "saved checkpoint" in line]


@pytest.mark.parametrize("seed", range(3))
def test_a_random_interleave_is_filtered_exactly_and_its_metric_lines_sampled(seed: int) -> None:
    """No period to find (step lines between other kinds at random, as helix prints them):
    the stream's shortcuts for it (the second successor tried before every rule, period
    searches that back off, a sample point checked without reading the line) give the
    reference's answer, and the sampled points are the lines they claim to be."""
    rnd = random.Random(seed)
    lines = [line_for(rnd.choice(["iter", "iter", "nccl", "timer", "unknown"]), rnd, step) for step in range(1, 6001)]
    size = sum(len(line) + 1 for line in lines)
    kept, stream, tracker = run_engine(lines, [size // 3, size // 2], sample_bytes=4096)
    want_kept, want_stats = reference(lines)
    assert [k.line_number for k in kept] == want_kept
    assert {rid: (s.count, s.first_line, s.last_line) for rid, s in stream.rule_stats().items()} == want_stats
    every = {n: line for n, line in enumerate(lines, 1) if "] iteration " in line}
    numbers = [p.line_number for p in tracker.curve()]
    assert numbers == sorted(set(numbers)) and set(numbers) <= set(every)
    assert numbers[-1] == max(every), "the newest point is never skipped"
    assert size // 4096 // 2 <= len(numbers) <= size // 4096 + 8
    for point in tracker.curve():
        assert f"iteration {point.step:8d}/" in every[point.line_number]


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=200),
       shape=st.tuples(st.integers(1, 6), st.integers(0, 5), st.integers(1, 6)),
       samples=st.integers(1, 20), lead=st.integers(0, 30))
def test_sampled_metric_lines_are_the_lines_they_claim_to_be(lengths, shape, samples, lead) -> None:
    lines_per, offset, n = shape
    offset, n = offset % lines_per, min(n, lines_per - offset % lines_per)
    count = len(lengths) - len(lengths) % lines_per or len(lengths)
    body = [f"{i}:" + "x" * length for i, length in enumerate(lengths[:count])]
    data = ("p" * lead + "\n" if lead else "").encode() + ("\n".join(body) + "\n").encode()
    start = data.index(b"\n") + 1 if lead else 0  # the span need not begin at the buffer's start
    indexes, texts = _sampled_lines(_Span(data, start, len(data)), samples, lines_per, offset, n)
    assert indexes == sorted(set(indexes))
    assert [t.decode() for t in texts] == [body[i] for i in indexes]
    assert all(offset <= i % lines_per < offset + n for i in indexes)
    metric = [i for i in range(len(body)) if offset <= i % lines_per < offset + n]
    assert indexes[-1:] == metric[-1:], "the last metric line is always read"
    assert len(indexes) <= samples


def test_memory_of_the_stream_does_not_grow_with_the_log() -> None:
    """Block programs and per-rule state are bounded; the stream keeps no lines."""
    lines = make_log(1, steps=2000)
    data = ("\n".join(lines) + "\n").encode()
    stream = FilterStream(FilterProgram(RULES, GUARD))
    for _ in range(5):
        stream.feed(data)
    assert len(stream._blocks) <= 64
    assert not hasattr(stream, "kept")


def test_catastrophic_pattern_is_linear_under_re2() -> None:
    """`(a+)+$` backtracks exponentially in Python `re`; RE2 runs it in linear time."""
    rule = FilterRule("evil", r"(a+)+$", trusted=False)
    stream = FilterStream(FilterProgram([rule], GUARD))
    data = (("a" * 5000 + "!\n") * 200).encode()
    kept = stream.feed(data)  # pytest-timeout fails the test if this hangs
    assert len(kept) == 200


def test_unknown_progress_field_is_refused() -> None:
    with pytest.raises(FilterCompileError):
        FilterProgram([FilterRule("bad", r"step (?P<password>\d+)")], GUARD)


def test_invalid_pattern_is_refused_with_its_text() -> None:
    with pytest.raises(FilterCompileError, match="cannot compile"):
        FilterProgram([FilterRule("bad", r"(unclosed")], GUARD)


def test_program_swap_keeps_statistics_by_rule_id() -> None:
    lines = make_log(2, steps=50)
    data = ("\n".join(lines) + "\n").encode()
    program = FilterProgram(RULES[:2], GUARD)
    stream = FilterStream(program)
    stream.feed(data)
    first = stream.rule_stats()["megatron.iteration"].count
    stream.set_program(FilterProgram(RULES, GUARD))
    stream.feed(data)
    stats = stream.rule_stats()
    assert stats["megatron.iteration"].count == 2 * first
    assert stats["megatron.timer"].first_line > len(lines)


@pytest.mark.parametrize("seed", range(3))
def test_a_metric_rule_learned_mid_log_samples_what_it_would_have_from_the_start(seed: int) -> None:
    """Learning must not change the progress read: sample points sit at fixed offsets of the
    log, so once the rule is in force (the first run learns it, the second has it from the
    start) both read the same metric lines, from its first run on."""
    lines = make_log(seed, steps=3000)
    data = ("\n".join(lines) + "\n").encode()
    cuts = sorted({data.rfind(b"\n", 0, c) + 1 for c in range(1 << 10, len(data), 1 << 10)} | {len(data)})
    switch = cuts[len(cuts) // 3]
    without_metric = [r for r in RULES if r.id != "megatron.iteration"]

    def points(learned_late: bool) -> list[int]:
        tracker = ProgressTracker()
        program = FilterProgram(without_metric if learned_late else RULES, GUARD)
        stream = FilterStream(program, on_progress=tracker.observe, sample_bytes=4096, sample_after=0)
        start = 0
        for stop in cuts:
            if learned_late and start == switch:
                stream.set_program(FilterProgram(RULES, GUARD))
            stream.feed(data[start:stop])
            start = stop
        return [p.line_number for p in tracker.curve() if p.line_number > data.count(b"\n", 0, switch) + 200]

    late, early = points(True), points(False)
    assert late and late == early


# A format whose step lines and data-loader lines take turns at random between heartbeat
# blocks (the bench's "helix"): the stream counts such stretches by each rule's literal.
HELIX_RULES = [
    FilterRule("helix.step", r"\[helix [\d:.]+ r\d+\] step +(?P<step>\d+) \| loss (?P<loss>[\d.]+) \| tok/s \d+"),
    FilterRule("helix.data", r"\[helix [\d:.]+ r\d+\] data: shard .+ fetched in [\d.]+ms"),
    FilterRule("helix.hb", r"\[helix [\d:.]+ r\d+\] hb step=\d+ util=\d+%"),
]


def helix_lines(seed: int, steps: int, *, clash: bool = False) -> list[str]:
    """Step lines with data lines between them at random, a heartbeat line per rank every
    50 steps; with `clash`, some data lines also hold the step rule's literal (a shard
    named ` | tok/s `), which the counts must notice."""
    rnd = random.Random(seed)
    lines: list[str] = []
    for step in range(1, steps + 1):
        lines.append(f"node-1: [helix 10:00:{step % 60:02d}.{step % 1000:03d} r0] step {step:6d} | loss {2 + rnd.random():.4f} | tok/s {rnd.randrange(10**5)}")
        for _ in range(rnd.choice([0, 0, 1, 2])):
            shard = "x | tok/s 1" if clash and rnd.random() < 0.05 else str(rnd.randrange(4096))
            lines.append(f"node-{rnd.randrange(4)}: [helix 10:00:01.000 r{rnd.randrange(8)}] data: shard {shard} fetched in {rnd.random() * 9:.1f}ms")
        if step % 50 == 0:
            lines.extend(f"node-1: [helix 10:00:02.000 r{r}] hb step={step} util={rnd.randrange(90, 101)}%" for r in range(8))
    return lines


def helix_reference(lines: list[str]) -> dict[str, tuple[int, int, int]]:
    compiled = [(r.id, re.compile(f"{ENVELOPE_PATTERN}(?:{r.pattern})")) for r in HELIX_RULES]
    stats: dict[str, tuple[int, int, int]] = {}
    for number, line in enumerate(lines, 1):
        rule = next(rid for rid, rx in compiled if rx.fullmatch(line))
        count, first, _ = stats.get(rule, (0, number, number))
        stats[rule] = (count + 1, first, number)
    return stats


@pytest.mark.parametrize(("seed", "clash"), [(0, False), (1, False), (2, True)])
def test_rules_that_take_turns_at_random_are_counted_exactly_in_stretches(seed: int, clash: bool) -> None:
    """The stretch where a few rules take turns is consumed at once and counted by each
    rule's literal (rules/filters.py, _mixed): counts, first and last lines stay the
    reference's; the sampled progress points are the lines they claim to be, the newest
    always read; where a line holds another rule's literal the counts stay exact."""
    lines = helix_lines(seed, 6000, clash=clash)
    size = sum(len(line) + 1 for line in lines)
    kept, stream, tracker = run_engine(lines, [size // 3, size // 2], rules=HELIX_RULES, sample_bytes=4096)
    assert kept == []
    assert stream._mix is not None or clash, "the stretch path was taken"
    assert {rid: (s.count, s.first_line, s.last_line) for rid, s in stream.rule_stats().items()} == helix_reference(lines)
    assert stream.lines_in == len(lines)
    steps = {n: line for n, line in enumerate(lines, 1) if "] step " in line}
    curve = tracker.curve()
    numbers = [p.line_number for p in curve]
    assert numbers == sorted(set(numbers)) and set(numbers) <= set(steps)
    assert numbers[-1] == max(steps), "the newest point is never skipped"
    assert size // 4096 // 2 <= len(numbers) <= size // 4096 + 8
    for point in curve:
        assert f"step {point.step:6d} |" in steps[point.line_number]


def test_stretches_read_the_progress_single_runs_would() -> None:
    """Learning must not change the progress read (the first run learns, the second has the
    rules from the start): with the stretch path or without it, the same points."""
    lines = helix_lines(3, 6000)
    data = ("\n".join(lines) + "\n").encode()
    cuts = sorted({data.rfind(b"\n", 0, c) + 1 for c in range(1 << 16, len(data), 1 << 16)} | {len(data)})

    def points(rules) -> list[tuple[int, int]]:
        tracker = ProgressTracker()
        stream = FilterStream(FilterProgram(rules, GUARD), on_progress=tracker.observe, sample_bytes=4096, sample_after=0)
        start = 0
        for stop in cuts:
            stream.feed(data[start:stop])
            start = stop
        assert stream.lines_in == len(lines)
        return [(p.line_number, p.step) for p in tracker.curve()]

    # the step rule spelt without a literal of its own (its words as classes): no stretch
    # can count it, so every run goes the usual way
    no_literal = [FilterRule("helix.step", r"\[helix [\d:.]+ r\d+\] [s]tep +(?P<step>\d+) [|] [l]oss (?P<loss>[\d.]+) [|] [t]ok/s \d+"),
                  *HELIX_RULES[1:]]
    assert points(HELIX_RULES) == points(no_literal)
