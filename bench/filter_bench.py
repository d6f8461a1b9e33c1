"""The filter path against ripgrep and GNU grep, same patterns, same file, one run.

    python -m bench.filter_bench [--log PATH] [--size 1G] [--repeat 3]

Generates a Megatron-style log if none is given (fixtures/logs/generate.py), then measures:
ripgrep `-v -c -f patterns` and GNU `grep -P -v -c` (the built-in filter patterns, each
anchored with the launcher envelope exactly as the engine compiles them), our filter on one
core and on two (the file split in halves at a line boundary), end-to-end `faultline
diagnose`, and the healthy log's compression. Figures go to stdout and bench/out/*.json.
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
from datetime import UTC, datetime
from pathlib import Path

from rules.envelope import ENVELOPE_PATTERN
from rules.extract import non_capturing
from rules.builtin import builtin_filter_rules

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def line_patterns() -> list[str]:
    # ripgrep and grep refuse a name used twice in one alternation: groups become plain ones
    return [f"^{ENVELOPE_PATTERN}(?:{non_capturing(rule.pattern)})$" for rule in builtin_filter_rules()]


def grep_pattern() -> str:
    """The same language as line_patterns() in one PCRE, the envelope written once: GNU grep
    takes -P with a single pattern, and PCRE2 refuses one that repeats the envelope per rule
    ("regular expression is too large")."""
    rules = "|".join(f"(?:{non_capturing(rule.pattern)})" for rule in builtin_filter_rules())
    return f"^{ENVELOPE_PATTERN}(?:{rules})$"


def timed(cmd: list[str], **kwargs) -> tuple[float, str, float]:
    """Wall seconds, stdout, and this child's own peak RSS in MB (wait4 gives its rusage)."""
    with tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, **kwargs)
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            err.seek(0)
            raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.read()[-500:]!r}")
    return seconds, out, usage.ru_maxrss / 1024


def best_of(repeat: int, cmd: list[str], **kwargs) -> tuple[float, str, float]:
    runs = [timed(cmd, **kwargs) for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def split_point(path: Path) -> int:
    size = path.stat().st_size
    with open(path, "rb") as handle:
        handle.seek(size // 2)
        handle.readline()
        return handle.tell()


def ours(path: Path, repeat: int) -> dict:
    cmd = [sys.executable, "-m", "bench.filter_run", str(path)]
    seconds, out, peak = best_of(repeat, cmd, cwd=ROOT)
    figures = json.loads(out)
    figures.update(wall_seconds=seconds, peak_rss_mb_child=peak)
    return figures


def ours_two_cores(path: Path, repeat: int) -> dict:
    middle = split_point(path)
    best = None
    for _ in range(repeat):
        began = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "bench.filter_run", str(path), *args],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)
                 for args in (["--stop", str(middle)], ["--start", str(middle)])]
        outs = [json.loads(p.communicate()[0]) for p in procs]
        seconds = time.perf_counter() - began
        if best is None or seconds < best["wall_seconds"]:
            best = {"wall_seconds": seconds, "kept": sum(o["kept"] for o in outs),
                    "lines": sum(o["lines"] for o in outs)}
    return best


def generate(size: str, path: Path, failure: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "fixtures.logs.generate", "big", "--size", size, "--out", str(path),
                    "--framework", "megatron", "--failure", failure, "--seed", "7"], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="a log to measure on (default: generate one)")
    parser.add_argument("--size", default="1G")
    parser.add_argument("--failure", default="none", help="failure to end the generated log with")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    path = args.log or OUT / f"megatron-{args.size}-{args.failure}.log"
    if not path.exists():
        print(f"generating {path} ...", file=sys.stderr)
        generate(args.size, path, args.failure)
    size_mb = path.stat().st_size / 1e6
    patterns = OUT / "patterns.txt"
    patterns.parent.mkdir(parents=True, exist_ok=True)
    patterns.write_text("\n".join(line_patterns()) + "\n")
    env = {**os.environ, "LC_ALL": "C"}

    results: dict = {"log": str(path), "size_mb": round(size_mb, 1), "rules": len(line_patterns()),
                     "cpu": os.cpu_count(), "when": datetime.now(UTC).isoformat(timespec="seconds")}
    rg = shutil.which("rg")
    if rg:
        seconds, out, _ = best_of(args.repeat, [rg, "-v", "-c", "-f", str(patterns), str(path)], env=env)
        results["ripgrep"] = {"seconds": seconds, "kept": int(out.strip() or 0), "mb_s": size_mb / seconds}
    grep = shutil.which("grep")
    if grep:
        seconds, out, _ = best_of(1, [grep, "-P", "-v", "-c", "-e", grep_pattern(), str(path)], env=env)
        results["grep"] = {"seconds": seconds, "kept": int(out.strip() or 0), "mb_s": size_mb / seconds}
    one = ours(path, args.repeat)
    one["mb_s"] = size_mb / one["seconds"]
    one["lines_s"] = one["lines"] / one["seconds"]
    results["faultline_1core"] = one
    two = ours_two_cores(path, args.repeat)
    two["mb_s"] = size_mb / two["wall_seconds"]
    results["faultline_2cores"] = two
    seconds, _, peak = timed([sys.executable, "-m", "service.cli", "diagnose", "--json", str(path)], cwd=ROOT,
                             env={**env, "FAULTLINE_DATA_DIR": str(OUT / "data")})
    results["diagnose_end_to_end"] = {"seconds": seconds, "peak_rss_mb": peak}
    if rg:
        results["ratio_1core_vs_ripgrep"] = one["mb_s"] / results["ripgrep"]["mb_s"]
        results["ratio_2cores_vs_ripgrep"] = two["mb_s"] / results["ripgrep"]["mb_s"]
    results["kept_share"] = one["kept"] / max(one["lines"], 1)
    (OUT / f"filter-{path.stem}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
