"""A stand-in for a training job under `faultline tail ... -- COMMAND`: it prints a real
framework's multi-rank output (the seeded generators of fixtures/logs/generators), each
rank to its own file, at a steady pace, until told to stop; then it fails (or finishes) the
way the generator says and exits with the launcher's status.

    python -m bench.live_writer --dir D --framework megatron --failure ecc_error --seed 3
                                --rate 500 --stop-file D/stop --journal D/journal.json

- Lines carrying torchrun's `[defaultN]:` (or `[rankN]:`) prefix go to `D/rankN.log`, as
  `torchrun --log-dir` splits a job's workers; torchrun's own lines, Slurm's and anything
  else without a rank go to standard output (the sidecar's `--tee` file).
- Writes are what a redirected process does with block-buffered output: a file gets 8 KiB
  blocks as they fill (so most writes end mid-line) and the rest at least every
  `--flush-s`, so the sidecar sees partial lines all the time, never one left for long.
- The lines are generated as they are needed (a few steps ahead): memory stays flat however
  long the job runs.
- `--journal` receives, at exit, what was written: every file's bytes, lines and CRC-32,
  and a timeline of (wall time, lines completed so far) per write round, from which the
  benchmark measures how long a line takes to become visible in the service.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from fixtures.logs.generators.base import Run
from fixtures.logs.generators.common import Job, Out
from fixtures.logs.generators.failures import FAILURES
from fixtures.logs.generators.frameworks import FRAMEWORKS

RANK = re.compile(rb"^\[(?:default|rank)(\d+)\]:")
SHAPE = {"launcher": "torchrun", "torch": "2.3", "nodes": 1, "gpus": 8, "slurm": True}
"""One node of 8 GPUs under torchrun: the `[defaultN]:` prefix names the global rank."""
STEPS_AHEAD = 20
BLOCK = 8192
FAILED_EXIT = 1
"""torchrun's status when a worker failed (ChildFailedError)."""


class TrainingOutput:
    """A framework's output as a job prints it: start-up, steps for as long as asked, an end."""

    def __init__(self, framework: str, failure: str | None, seed: int):
        fw = FRAMEWORKS[framework]()
        shape = {**SHAPE, "role": fw.big_shape.get("role", "default")}
        self.job = Job(seed=seed, framework=fw.name, name=fw.job_name, **shape)
        self.out = Out()
        self.run = Run(fw, self.job, self.out, fw.curve(self.job.rng), record=False)
        # a long run, as fixtures/logs/generators/big.py sets one up
        fw.train_iters = 1_000_000
        fw.save_interval = max(fw.save_interval, 1000)
        fw.eval_interval = fw.eval_interval and max(fw.eval_interval, 1000)
        self.run.curve.total = fw.train_iters
        self.fw, self.failure = fw, failure
        fw.start(self.run)

    def take(self) -> list[str]:
        lines, self.out.lines = self.out.lines, []
        return lines

    def more(self) -> list[str]:
        self.run.train(STEPS_AHEAD)
        return self.take()

    def end(self) -> tuple[list[str], str | None, int]:
        """The last lines, the reason they show (None: a clean end), the exit status."""
        if self.failure is None:
            self.fw.finish(self.run)
            return self.take(), None, 0
        self.job.tick(self.job.rng.uniform(0.5, 20))
        outcome = FAILURES[self.failure](self.run)
        return self.take(), outcome.reason, FAILED_EXIT


@dataclass
class Sink:
    """One output file with stdio's block buffering; accounts for every byte written."""

    fd: int
    path: str
    pending: bytearray = field(default_factory=bytearray)
    flushed_at: float = 0.0
    bytes: int = 0
    lines: int = 0
    """Line ends as the service counts them: LF, CR, CRLF (tqdm's bars end in CR)."""
    crc32: int = 0
    _ended_cr: bool = False

    def add(self, line: bytes) -> None:
        self.pending += line
        self.pending += b"\n"

    def write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            done = os.write(self.fd, view)
            written = view[:done].tobytes()
            self.crc32 = zlib.crc32(written, self.crc32)
            self.lines += written.count(b"\n") + written.count(b"\r") - written.count(b"\r\n")
            if self._ended_cr and written.startswith(b"\n"):
                self.lines -= 1  # a CRLF cut in two by the block boundary
            self._ended_cr = written.endswith(b"\r")
            self.bytes += done
            view = view[done:]

    def flush(self, now: float, every_s: float, *, force: bool = False) -> None:
        full = len(self.pending) - len(self.pending) % BLOCK
        if full:
            self.write(self.pending[:full])
            del self.pending[:full]
            self.flushed_at = now
        if self.pending and (force or now - self.flushed_at >= every_s):
            self.write(self.pending)
            self.pending.clear()
            self.flushed_at = now


class Writer:
    def __init__(self, folder: Path, *, flush_s: float):
        self.folder = folder
        self.flush_s = flush_s
        self.sinks: dict[bytes | None, Sink] = {None: Sink(sys.stdout.fileno(), "<stdout>")}

    def sink(self, line: bytes) -> Sink:
        match = RANK.match(line)
        key = match.group(1) if match else None
        sink = self.sinks.get(key)
        if sink is None:
            path = self.folder / f"rank{int(key)}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            sink = self.sinks[key] = Sink(fd, str(path))
        return sink

    def print(self, lines: list[str]) -> None:
        for line in lines:
            data = line.encode()
            self.sink(data).add(data)

    def flush(self, *, force: bool = False) -> None:
        now = time.monotonic()
        for sink in self.sinks.values():
            sink.flush(now, self.flush_s, force=force)

    @property
    def lines(self) -> int:
        return sum(s.lines for s in self.sinks.values())

    def close(self) -> None:
        self.flush(force=True)
        for key, sink in self.sinks.items():
            if key is not None:
                os.close(sink.fd)


def vm_hwm_mb(pid: int | str = "self") -> float:
    """VmHWM: the peak of this program's own memory. (ru_maxrss would also count what the
    process held before exec, i.e. whatever forked it.)"""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live_writer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the rank files go")
    parser.add_argument("--framework", default="megatron", choices=sorted(FRAMEWORKS))
    parser.add_argument("--failure", default="none", help="a reason of fixtures/logs/generators/failures.py, or none")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=500.0, help="lines per second")
    parser.add_argument("--tick-s", type=float, default=0.1, help="how often lines are printed")
    parser.add_argument("--flush-s", type=float, default=1.0, help="a partly filled buffer is written after this long")
    parser.add_argument("--max-lines", type=int, default=0, help="stop after this many lines (0: only when told)")
    parser.add_argument("--stop-file", type=Path, default=None, help="stop training once this file exists")
    parser.add_argument("--journal", type=Path, default=None)
    args = parser.parse_args(argv)
    failure = None if args.failure == "none" else args.failure
    if failure is not None and failure not in FAILURES:
        parser.error(f"unknown failure {failure!r}")
    args.dir.mkdir(parents=True, exist_ok=True)
    output = TrainingOutput(args.framework, failure, args.seed)
    writer = Writer(args.dir, flush_s=args.flush_s)
    timeline: list[tuple[float, int]] = []
    writer.print(output.take())  # start-up comes out at once, as a job prints it
    ready: list[str] = []
    printed = 0
    began = time.monotonic()
    while not (args.stop_file is not None and args.stop_file.exists()):
        if args.max_lines and printed >= args.max_lines:
            break
        due = int((time.monotonic() - began) * args.rate) - printed
        if args.max_lines:
            due = min(due, args.max_lines - printed)
        while len(ready) < due:
            ready += output.more()
        if due > 0:
            writer.print(ready[:due])
            del ready[:due]
            printed += due
        writer.flush()
        timeline.append((round(time.time(), 4), writer.lines))
        time.sleep(args.tick_s)
    last, reason, exit_code = output.end()
    writer.print(last)
    writer.close()
    timeline.append((round(time.time(), 4), writer.lines))
    if args.journal is not None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        journal = {"framework": args.framework, "failure": failure, "reason": reason, "exit_code": exit_code,
                   "lines": writer.lines, "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                   "peak_rss_mb": vm_hwm_mb(),
                   "files": {s.path: {"bytes": s.bytes, "lines": s.lines, "crc32": f"{s.crc32:08x}"}
                             for s in writer.sinks.values()},
                   "timeline": timeline}
        tmp = args.journal.with_suffix(".tmp")
        tmp.write_text(json.dumps(journal))
        os.replace(tmp, args.journal)
    return exit_code


if __name__ == "__main__":
    raise SystemExit(main())
