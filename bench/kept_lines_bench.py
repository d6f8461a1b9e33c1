"""The kept-line path when nothing is filtered: every line of a log no rule knows is kept.

    python -m bench.kept_lines_bench [--size 30M] [--repeat 3]

A log in the made-up "helix" format (fixtures/logs/unknown_formats.py: no built-in filter
rule reads it), with the Log Agent off and nothing learned (`--no-learn`), so every line goes
through what a kept line costs: redaction, the error guard, the diagnosis rules, progress
sniffing and extraction. Reported: kept lines per second and MB/s of `faultline diagnose`
end to end (start-up included), of the same run's reading alone (in process, one core), the
peak RSS, and ripgrep's MB/s counting the same file's lines (`rg -c ''`) for scale. The
issue's goal (150,000 kept lines per second on one core) is stated beside the figures, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.filter_bench import OUT, ROOT, best_of
from bench.unknown_formats_bench import generate

GOAL_LINES_PER_S = 150_000


def in_process(path: Path) -> tuple[float, int, int]:
    """(seconds, lines in, lines kept) of one JobRun reading the file, start-up left out."""
    from rules.job import JobMeta, JobRun
    from rules.rulebook import Rulebook
    from service.ingest.sources import feed_path

    run = JobRun(Rulebook(), JobMeta(name="kept-lines-bench"))
    began = time.perf_counter()
    feed_path(run, str(path))
    diagnosis = run.finish()
    seconds = time.perf_counter() - began
    compression = diagnosis.to_dict()["compression"]
    return seconds, compression["lines_in"], compression["lines_kept"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="30M")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = generate("helix", args.size)
    mb = path.stat().st_size / 1e6
    faultline = str(Path(sys.executable).with_name("faultline"))
    store = tempfile.mkdtemp(prefix="faultline-bench-")
    env = {**os.environ, "FAULTLINE_DATA_DIR": store, "FAULTLINE_LOG_AGENT": "false"}
    try:
        seconds, out, rss = best_of(args.repeat, [faultline, "diagnose", "--json", "--no-learn", str(path)],
                                    env=env, cwd=ROOT)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    compression = json.loads(out)["compression"]
    lines, kept = compression["lines_in"], compression["lines_kept"]
    inner = min((in_process(path) for _ in range(args.repeat)), key=lambda r: r[0])
    results = {"mb": round(mb, 1), "lines": lines, "kept": kept,
               "cli_seconds": round(seconds, 2), "cli_kept_lines_per_s": round(kept / seconds),
               "cli_mb_s": round(mb / seconds, 1), "peak_rss_mb": round(rss),
               "in_process_seconds": round(inner[0], 2), "in_process_kept_lines_per_s": round(inner[2] / inner[0]),
               "in_process_mb_s": round(mb / inner[0], 1), "goal_kept_lines_per_s": GOAL_LINES_PER_S}
    if shutil.which("rg"):
        began = time.perf_counter()
        subprocess.run(["rg", "-c", "", str(path)], check=True, capture_output=True)
        results["ripgrep_mb_s"] = round(mb / (time.perf_counter() - began), 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kept_lines.json").write_text(json.dumps(results, indent=2))
    rg = f"; ripgrep counts its lines at {results['ripgrep_mb_s']} MB/s" if "ripgrep_mb_s" in results else ""
    print(f"helix {results['mb']} MB, {lines} lines, {kept} kept ({100 * kept / max(lines, 1):.1f}%)\n"  # noqa: T201
          f"  diagnose (start-up included): {results['cli_kept_lines_per_s']:,} kept lines/s, "
          f"{results['cli_mb_s']} MB/s, peak RSS {results['peak_rss_mb']} MB\n"
          f"  reading alone, in process: {results['in_process_kept_lines_per_s']:,} kept lines/s, "
          f"{results['in_process_mb_s']} MB/s (goal {GOAL_LINES_PER_S:,} kept lines/s){rg}")


if __name__ == "__main__":
    main()
