"""Filter one file (or a byte range of it) with the built-in rules, on one core, and print
figures as JSON. Run as a child process by bench/filter_bench.py so its peak RSS is its own."""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator

from rules.filters import FilterProgram, FilterStream
from rules.guard import ErrorGuard
from rules.builtin import builtin_filter_rules
from rules.progress import ProgressTracker
from service.ingest.lines import CHUNK_BYTES, iter_line_buffers, reuse_freed_buffers


def _read_range(path: str, start: int, stop: int | None) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = None if stop is None else stop - start
        while remaining is None or remaining > 0:
            chunk = handle.read(CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining))
            if not chunk:
                return
            if remaining is not None:
                remaining -= len(chunk)
            yield chunk


def run(path: str, start: int, stop: int | None) -> dict:
    reuse_freed_buffers()  # as `faultline diagnose` does
    program = FilterProgram(builtin_filter_rules(), ErrorGuard())
    tracker = ProgressTracker()
    stream = FilterStream(program, on_progress=tracker.observe)
    kept = error_like = 0
    began = time.perf_counter()
    # the same line splitting as `faultline diagnose` (service/ingest/lines.py), over a byte range
    for buffer in iter_line_buffers(_read_range(path, start, stop), gzip=False):
        for line in stream.feed(buffer):
            kept += 1
            error_like += line.error_like
    seconds = time.perf_counter() - began
    return {
        "seconds": seconds, "bytes": stream.bytes_in, "lines": stream.lines_in, "kept": kept,
        "error_like_kept": error_like, "progress_points": tracker.points_seen, "last_step": tracker.last_step,
        "rules": len(program.rules), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.path, args.start, args.stop)))


if __name__ == "__main__":
    main()
