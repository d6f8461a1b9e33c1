"""The embedded miner: masking, Drain clusters, and template-to-regex on real line shapes."""

from __future__ import annotations

import re

import pytest

from agents.templates import MinerParams, mask, messages_of, mine, template_regex, variant_params
from agents.validation import Validator
from rules.envelope import ENVELOPE_PATTERN

# real MaxText lines (AI-Hypercomputer/maxtext#4847, #2232)
MAXTEXT = [
    "I0811 21:54:55.531340 138304841739136 metric_logger.py:226] completed step: 1, seconds: 0.631, TFLOP/s/device: 5688.282, Tokens/s/device: 311629.521, total_weights: 1572864, loss: 12.979, lm_loss: 12.979, perplexity: 433358.281",
    "I0811 21:55:06.119312 138304841739136 metric_logger.py:226] completed step: 2, seconds: 10.228, TFLOP/s/device: 350.869, Tokens/s/device: 19222.175, total_weights: 1572864, loss: 12.980, lm_loss: 12.980, perplexity: 433463.719",
    "I0811 21:55:16.704861 138304841739136 metric_logger.py:226] completed step: 3, seconds: 10.344, TFLOP/s/device: 346.932, Tokens/s/device: 19006.461, total_weights: 1572864, loss: 12.979, lm_loss: 12.979, perplexity: 433110.281",
]
MEMSTATS = [f"\tUsing (GB) 44.6 / 95.74 (46.584500%) on TPU_{i}(process=0,({i % 2},{i // 2},0,0))" for i in range(4)]


def engine_match(pattern: str, line: str) -> bool:
    return re.fullmatch("%s(?:%s)" % (ENVELOPE_PATTERN, pattern), line) is not None


def test_mask_types_values() -> None:
    assert mask("saved to gs://bucket/run/ckpt/1000 from 10.0.3.7:8476 at 2024-11-03T07:15:22Z") == (
        "saved to \ue000path\ue001 from \ue000ip\ue001 at \ue000ts\ue001")
    assert mask("host trn-a17 id 7f3a9c0e pid 4312 loss=-0.25") == (
        "host \ue000host\ue001 id \ue000hex\ue001 pid \ue000num\ue001 loss=\ue000num\ue001")
    assert mask("TFLOP/s/device: 134.9") == "TFLOP/s/device: \ue000num\ue001"  # a unit is not a path


def test_maxtext_step_line_becomes_one_regex_with_progress_captures() -> None:
    (template,) = mine(MAXTEXT, min_support=3)
    assert template.members == (0, 1, 2)
    assert all(engine_match(template.pattern, line) for line in MAXTEXT)
    m = re.fullmatch(template.pattern, MAXTEXT[1])
    assert m.group("step") == "2" and m.group("loss") == "12.980" and m.group("step_time_s") == "10.228"
    assert [f.name for f in template.fields if f.captured] == ["step", "step_time_s", "loss"]
    assert "completed step: <num>" in template.template
    # another run's values, dates and widths match too
    assert engine_match(template.pattern, "I1231 23:59:59.000001 7 metric_logger.py:231] completed step: 120000, "
                        "seconds: 2.5, TFLOP/s/device: 1e3, Tokens/s/device: 8.0, total_weights: 1, loss: 1.5, "
                        "lm_loss: 1.5, perplexity: 4.5")


def test_whitespace_is_kept_as_runs_and_never_as_newline() -> None:
    (template,) = mine(MEMSTATS, min_support=3)
    assert template.pattern.startswith("[ \\t]*Using")
    assert "\\s" not in template.pattern
    assert all(engine_match(template.pattern, line) for line in MEMSTATS)
    assert Validator(corpus=[]).validate(template.pattern, segment=MEMSTATS, claims=range(4)).ok


def test_a_varying_word_becomes_a_typed_wildcard_with_its_shared_prefix() -> None:
    members = ["[helix 22:40:05.028 trn-a17/r00] config model.n_layers = 40",
               "[helix 22:40:05.013 trn-a17/r00] config optim.lr = 3.0e-04",
               "[helix 22:40:05.001 trn-a17/r00] config data.path = /mnt/datasets/web"]
    lines = [m for m in members]
    templates = mine(lines, MinerParams(sim_th=0.5), min_support=3)
    assert len(templates) == 1
    assert all(engine_match(templates[0].pattern, line) for line in lines)
    assert "config" in templates[0].pattern


def test_template_regex_from_explicit_tokens() -> None:
    members = ["host=trn-a17 rank=3 it=1200", "host=trn-b03 rank=4 it=1210"]
    pattern, readable, fields = template_regex(members, ["\ue002", "rank=\ue000num\ue001", "it=\ue000num\ue001"])
    assert all(re.fullmatch(pattern, m) for m in members)
    assert pattern.startswith("host=")  # the shared prefix of the wildcard stays literal
    assert [f.name for f in fields] == ["host", "rank", "step"]
    assert readable == "<*> rank=<num> it=<num>"


def test_distinct_shapes_stay_distinct_and_rare_ones_are_left_out() -> None:
    lines = MAXTEXT + MEMSTATS + ["Memstats: After params initialized:"]
    templates = mine(lines, min_support=3)
    assert sorted(len(t.members) for t in templates) == [3, 4]


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_variants_differ(k: int) -> None:
    params = variant_params(k)
    assert len(params) == k
    assert len({(p.sim_th, p.depth, p.order, p.seed) for p in params}) == k


def test_messages_strip_launcher_envelopes() -> None:
    assert messages_of(["[default3]:[rank3]: step 1", "trn-a17: [helix] ok"]) == ["step 1", "[helix] ok"]
