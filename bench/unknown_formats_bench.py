"""End to end on formats no pack knows: the first run (the Log Agent learns) and the second.

    python -m bench.unknown_formats_bench [--size 100M] [--repeat 1]

For two generated formats no built-in pack reads (MaxText on multi-host TPU, the made-up
"helix" trainer; fixtures/logs/unknown_formats.py), each ending in a failure, with a fresh
store: `faultline compress --json` on the whole file (the first run, which learns filter
rules for the job's family), then again with the same job name (the second run, with those
rules in force); then `faultline diagnose --json` twice the same way. Reported per format:
MB/s of each run, the share of lines kept, rules learned, whether both diagnoses agree on
status, action, suspects, root cause and progress (they must: learning may change what is
kept, never the answer), and ripgrep's MB/s on the same file with the built-in filter
patterns (`rg -v -c -f`, as bench.filter_bench), with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.filter_bench import OUT, ROOT, best_of, line_patterns, timed
from fixtures.logs.generate import parse_size
from fixtures.logs.unknown_formats import helix_log, maxtext_log

FORMATS = {"maxtext": (maxtext_log, "oom"), "helix": (helix_log, "ecc")}


def generate(name: str, size: str) -> Path:
    """The format's log of about `size` bytes, ending in its failure (cached in bench/out)."""
    path = OUT / f"{name}-{size}.log"
    if path.exists():
        return path
    make, failure = FORMATS[name]
    sample = len(make(steps=2000, failure=failure).text().encode())
    steps = max(2000, int(2000 * parse_size(size) / sample))
    print(f"generating {path} ({steps} steps) ...", file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(make(steps=steps, failure=failure).text(), encoding="utf-8")
    return path


def _answer(d: dict) -> dict:
    """What learning must never change (the issue's list): status, action, suspect nodes,
    the root cause and the progress read. Compression and filter counts are what learning
    is there to change; `points` counts metric lines read, more once a rule reads them."""
    root = d.get("root_cause") or {}
    return {"status": d["status"], "action": d["action"], "suspect_nodes": d.get("suspect_nodes"),
            "root": [root.get(k) for k in ("reason", "origin", "line", "line_number", "rank", "node")],
            "progress": {k: v for k, v in (d.get("progress") or {}).items() if k != "points"}}


def _twice(faultline: str, command: str, name: str, path: Path) -> tuple[list, list[dict], list[float]]:
    """Two runs of one command on one file with one job name, in a fresh store."""
    store = tempfile.mkdtemp(prefix="faultline-bench-")
    try:
        env = {**os.environ, "FAULTLINE_DATA_DIR": store}
        cmd = [faultline, command, "--json", "--job-name", f"{name}-bench-run", str(path)]
        runs = [timed(cmd, env=env, cwd=ROOT) for _ in range(2)]
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return [r[0] for r in runs], [json.loads(r[1]) for r in runs], [r[2] for r in runs]


def run_format(name: str, size: str, repeat: int) -> dict:
    # generated in a child: a parent that held the log in memory would lend the runs it forks
    # its pages, and their peak RSS (wait4) would count them
    subprocess.run([sys.executable, "-c", f"from bench.unknown_formats_bench import generate; generate({name!r}, {size!r})"],
                   cwd=ROOT, check=True)
    path = OUT / f"{name}-{size}.log"
    size_mb = path.stat().st_size / 1e6
    faultline = str(Path(sys.executable).with_name("faultline"))
    # compress: ingestion, filtering and the Log Agent's learning, nothing else
    seconds, outs, rss = _twice(faultline, "compress", name, path)
    figures = {
        "format": name, "mb": round(size_mb, 1), "lines": outs[0]["lines_in"],
        "compress_first_mb_s": size_mb / seconds[0], "compress_second_mb_s": size_mb / seconds[1],
        "first_kept_pct": 100 * outs[0]["lines_kept"] / max(1, outs[0]["lines_in"]),
        "second_kept_pct": 100 * outs[1]["lines_kept"] / max(1, outs[1]["lines_in"]),
        "rules_learned": outs[0].get("rules_learned", 0), "compress_peak_rss_mb": max(rss),
    }
    # diagnose: the same plus the rules and, where they are not sure, the Failure Agent
    # (its embedding model loads once per process, its knowledge is embedded once per store)
    seconds, outs, rss = _twice(faultline, "diagnose", name, path)
    answers = [_answer(d) for d in outs]
    figures.update(diagnose_first_mb_s=size_mb / seconds[0], diagnose_second_mb_s=size_mb / seconds[1],
                   diagnose_peak_rss_mb=max(rss), same_diagnosis=answers[0] == answers[1],
                   reason=answers[0]["root"][0])
    rg = shutil.which("rg")
    if rg:
        patterns = OUT / "patterns.txt"
        patterns.write_text("\n".join(line_patterns()) + "\n")
        seconds, _, _ = best_of(repeat, [rg, "-v", "-c", "-f", str(patterns), str(path)],
                                env={**os.environ, "LC_ALL": "C"})
        figures["ripgrep_mb_s"] = size_mb / seconds
        figures["compress_first_vs_ripgrep"] = figures["compress_first_mb_s"] / figures["ripgrep_mb_s"]
        figures["compress_second_vs_ripgrep"] = figures["compress_second_mb_s"] / figures["ripgrep_mb_s"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="100M")
    parser.add_argument("--repeat", type=int, default=1, help="ripgrep runs (best of)")
    parser.add_argument("--format", choices=sorted(FORMATS), action="append")
    args = parser.parse_args()
    results = [run_format(name, args.size, args.repeat) for name in (args.format or sorted(FORMATS))]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "unknown_formats.json").write_text(json.dumps(results, indent=2))
    for r in results:
        rg = (f"  ripgrep {r['ripgrep_mb_s']:.0f} MB/s: compress first {r['compress_first_vs_ripgrep']:.2f}x, "
              f"second {r['compress_second_vs_ripgrep']:.2f}x" if "ripgrep_mb_s" in r else "  ripgrep: not installed")
        print(f"{r['format']:8s} {r['mb']:.0f} MB, {r['lines']} lines\n"  # noqa: T201
              f"  compress: first run {r['compress_first_mb_s']:.1f} MB/s, kept {r['first_kept_pct']:.2f}%, "
              f"{r['rules_learned']} rules learned; second run {r['compress_second_mb_s']:.1f} MB/s, kept "
              f"{r['second_kept_pct']:.2f}%; peak RSS {r['compress_peak_rss_mb']:.0f} MB\n"
              f"  diagnose: first run {r['diagnose_first_mb_s']:.1f} MB/s, second {r['diagnose_second_mb_s']:.1f} MB/s, "
              f"peak RSS {r['diagnose_peak_rss_mb']:.0f} MB; same diagnosis both times: {r['same_diagnosis']} "
              f"({r['reason']})\n{rg}")

if __name__ == "__main__":
    main()
