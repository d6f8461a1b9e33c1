"""What a short command costs before it reads a line: `faultline --help`, and `faultline
diagnose` of a 10-line log that a rule resolves, on a new store and on one already made.

    python -m bench.startup_bench [--repeat 5]

Reported per case: the best and the median wall seconds of `--repeat` runs and the peak RSS.
The issue's goals (≤ 0.3 s for --help, ≤ 0.6 s for the diagnose) are stated beside the
figures, never asserted: the machine's speed varies from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.filter_bench import OUT, ROOT, timed

TEN_LINES = """\
[2025-03-31 05:54:07] iteration       10/  242204 | consumed samples: 80 | lm loss: 2.1E+00 |
Traceback (most recent call last):
  File "pretrain_gpt.py", line 412, in <module>
    pretrain(train_valid_test_datasets_provider, model_provider)
  File "megatron/training/training.py", line 301, in pretrain
    iteration = train(forward_step_func, model, optimizer)
  File "megatron/core/datasets/gpt_dataset.py", line 88, in __getitem__
    sample = self.samples[idx]["tokens"]
KeyError: 'tokens'
[2025-03-31 05:54:09] exiting program after 1 iteration
"""
GOALS = {"help": 0.3, "diagnose_new_store": 0.6, "diagnose": 0.6}


def measure(cmd: list[str], repeat: int, env: dict[str, str], fresh_store: bool) -> dict:
    runs = []
    for _ in range(repeat):
        store = tempfile.mkdtemp(prefix="faultline-bench-") if fresh_store else env["FAULTLINE_DATA_DIR"]
        try:
            runs.append(timed(cmd, env={**env, "FAULTLINE_DATA_DIR": store}, cwd=ROOT))
        finally:
            if fresh_store:
                shutil.rmtree(store, ignore_errors=True)
    seconds = [r[0] for r in runs]
    return {"best_s": round(min(seconds), 3), "median_s": round(statistics.median(seconds), 3),
            "peak_rss_mb": round(max(r[2] for r in runs), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    faultline = str(Path(sys.executable).with_name("faultline"))
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "ten-lines.log"
    log.write_text(TEN_LINES)
    store = tempfile.mkdtemp(prefix="faultline-bench-")
    env = {**os.environ, "FAULTLINE_DATA_DIR": store}
    try:
        answer = json.loads(timed([faultline, "diagnose", "--json", str(log)], env=env, cwd=ROOT)[1])
        reason = (answer.get("root_cause") or {}).get("reason")
        if reason != "key_error":
            raise SystemExit(f"the 10-line log should be resolved by a rule (key_error), got {reason!r}")
        results = {
            "help": measure([faultline, "--help"], args.repeat, env, fresh_store=False),
            "diagnose_new_store": measure([faultline, "diagnose", str(log)], args.repeat, env, fresh_store=True),
            "diagnose": measure([faultline, "diagnose", str(log)], args.repeat, env, fresh_store=False),
        }
    finally:
        shutil.rmtree(store, ignore_errors=True)
    for name, figures in results.items():
        print(f"{name:20} best {figures['best_s']:.2f} s, median {figures['median_s']:.2f} s "
              f"(goal {GOALS[name]} s), peak RSS {figures['peak_rss_mb']:.0f} MB")
    (OUT / "startup.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
