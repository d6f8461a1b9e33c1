"""`faultline eval`: the baselines, the scoring and the command on a small labelled folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.errors import BadInput
from service.evaluate import Guess, Label, Scored, baselines, load_labels, score

ROOT = Path(__file__).resolve().parents[2]


def test_the_baselines_take_the_first_error_and_the_last_exception() -> None:
    lines = ["loading model", "WARNING: retrying after error 503", "Traceback (most recent call last):",
             "KeyError: 'optimizer'", "During handling of the above exception, another exception occurred:",
             "RuntimeError: CUDA error: an illegal memory access was encountered", "done"]
    first, last = baselines(lines)
    assert first == Guess("unknown", "unknown", "WARNING: retrying after error 503")
    assert last == Guess("runtime_error", "user", lines[5])
    assert baselines(["all good", "step 10 loss 2.3"]) == (Guess(None, None, None), Guess(None, None, None))


def test_score_counts_reason_origin_line_hard_and_silent() -> None:
    a = Label("a.log", "ecc_error", "infrastructure", "infrastructure", "ECC error", hard=True)
    b = Label("b.log", "key_error", "script", "unknown", "KeyError: 'x'")
    c = Label("c.log", None, None, None, None, status="healthy")
    none = Guess(None, None, None)
    results = [
        Scored(a, Guess("ecc_error", "infrastructure", "[rank3] uncorrectable ECC error seen", "failed"), none, none, 1.0),
        Scored(b, Guess(None, None, None, "running"), none, Guess("key_error", "user", "KeyError: 'x'"), 2.0),
        Scored(c, Guess(None, None, None, "healthy"), none, none, 3.0),
    ]
    report = score(results)
    assert report.figures["ours"] == {"reason": 0.667, "origin": 1.0, "line": 0.667, "hard_reason": 1.0, "silent": 0.5}
    assert report.figures["last_exception"]["reason"] == 0.667  # b, and c where it names nothing
    assert report.origin_known == 2 and report.hard == 1 and report.silent == ["b.log"]
    assert report.seconds_per_log == 2.0
    assert [m["file"] for m in report.mistakes] == ["b.log"]
    assert report.confirmed == 0 and report.confirmed_figures == {}


def test_the_logs_whose_thread_confirmed_the_cause_have_figures_of_their_own() -> None:
    sure = Label("a.log", "ecc_error", "infrastructure", "infrastructure", "ECC error", confirmed=True)
    unsure = Label("b.log", "key_error", "script", "user", "KeyError: 'x'", confirmed=False)
    none = Guess(None, None, None)
    report = score([Scored(sure, Guess("cuda_error", "infrastructure", "ECC error here", "failed"), none, none, 1.0),
                    Scored(unsure, Guess("key_error", "user", "KeyError: 'x'", "failed"), none, none, 1.0)])
    assert report.confirmed == 1
    assert report.confirmed_figures["ours"] == {"reason": 0.0, "origin": 1.0, "line": 1.0}
    assert report.figures["ours"]["reason"] == 0.5


@pytest.mark.parametrize(("line", "message"), [
    ('{"file": "x.log"}', "missing"),
    ('{"file": "x.log", "reason": "bad_reason", "category": null, "origin": "user", "root_cause_line": "x"}', "unknown reason"),
    ('{"file": "gone.log", "reason": "key_error", "category": "script", "origin": "user", "root_cause_line": "x"}', "no file"),
    ("not json", "not JSON"),
])
def test_a_bad_label_is_an_error_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "x.log").write_text("KeyError: 'x'\n")
    (tmp_path / "labels.jsonl").write_text(line + "\n")
    with pytest.raises(BadInput, match=message):
        load_labels(tmp_path)


def test_the_command_scores_a_folder(tmp_path: Path) -> None:
    (tmp_path / "oom.log").write_text(
        "step 10 loss 2.1\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.15 GiB of which 1.2 GiB is free.\n")
    (tmp_path / "labels.jsonl").write_text(json.dumps(
        {"file": "oom.log", "reason": "out_of_memory", "category": "framework", "origin": "user",
         "root_cause_line": "torch.OutOfMemoryError: CUDA out of memory."}) + "\n")
    env = {**os.environ, "FAULTLINE_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "eval", str(tmp_path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["logs"] == 1 and report["figures"]["ours"]["reason"] == 1.0
    assert not (tmp_path / "data").exists(), "eval must not write to the user's store"
    proc = subprocess.run([sys.executable, "-m", "service.cli", "eval", str(tmp_path / "nowhere")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "not a folder" in proc.stderr


def _corpus_folder(tmp_path: Path, split: str, count: int) -> list[dict]:
    """`count` labelled logs of the real corpus's `split`, copied with their labels."""
    real = ROOT / "fixtures" / "real"
    items = [json.loads(raw) for raw in (real / "labels.jsonl").read_text().splitlines() if raw.strip()]
    chosen = [item for item in items if item.get("split") == split and item.get("reason")][:count]
    for item in chosen:
        target = tmp_path / item["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((real / item["file"]).read_bytes())
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(item) + "\n" for item in chosen))
    return chosen


def test_a_log_whose_own_line_seeds_the_knowledge_is_scored_without_it(tmp_path: Path, minilm) -> None:
    from agents.knowledge import load_real_incidents, seed_incidents
    from rules.builtin import builtin_diagnosis_rules
    from service.evaluate import run_eval

    chosen = _corpus_folder(tmp_path / "dev", "dev", 4)
    sources = frozenset(item["source"] for item in chosen)
    real = load_real_incidents()
    own = {item["line"] for item in real if item["source"] in sources}
    others = {item["line"] for item in real if item["source"] not in sources}
    assert own - others, "the dev split's root-cause lines seed the knowledge base"

    def real_lines(**withheld) -> set[str]:
        return {i.text for i in seed_incidents(builtin_diagnosis_rules(), **withheld) if i.confirmed_by == "real_corpus"}

    assert (own - others) & real_lines()
    assert not (own - others) & real_lines(withheld_sources=sources)

    report = run_eval(tmp_path / "dev", split=None, embedder=minilm)
    assert report.withheld_folds == 2 and report.logs == 4
    # the test split never seeds the knowledge: nothing to withhold, one pass
    _corpus_folder(tmp_path / "test", "test", 2)
    assert run_eval(tmp_path / "test", split=None, embedder=minilm).withheld_folds == 0
