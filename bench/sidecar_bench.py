"""The sidecar and the live-job server, measured on loopback; and issue 5's acceptance run.

    python -m bench.sidecar_bench [--lines 1000000] [--ranks 8] [--skip-chaos] [--skip-throughput]

1. Throughput: LINES lines of a Megatron-style job on RANKS rank files (tests/support/
   rank_writer.py) are on disk; `faultline serve` (SQLite) and `faultline tail` run as child
   processes; the clock runs from the job's creation to the server having every line.
   Reported: lines/s and MB/s, CPU seconds and peak RSS of the sidecar and the server.
   Goal: at least 100,000 lines/s.
2. Chaos (the acceptance test at full size): the same writer appends LINES lines with two
   rotations while the server and the sidecar are each killed (SIGKILL) and restarted; the
   server must end with every line exactly once (count and CRC-32 of every file).

Figures go to stdout and bench/out/sidecar.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.support.rank_writer import RankFiles
from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
JOB = "gpt-7b-pretrain-bench"


def env_for(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    return {**env, "PYTHONPATH": str(ROOT), "FAULTLINE_DATA_DIR": str(folder), "FAULTLINE_ADMIN_ENABLED": "false"}


def sidecar_argv(url: str, logs: Path, state: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", "tail", "--server", url, "--job-name", JOB, "--state-dir",
            str(state), "--glob-interval", "0.2", "--poll-interval", "0.05", "--rotate-wait", "1",
            "--retry-max", "0.5", "--quiet", *extra, str(logs / "rank*.log")]


def job_lines(client: httpx.Client, url: str) -> tuple[str | None, int]:
    try:
        found = client.get(f"{url}/jobs", params={"name": JOB}).json()["data"]
    except httpx.TransportError:
        return None, -1
    return (found[0]["id"], found[0]["lines_received"]) if found else (None, 0)


def wait_for(client: httpx.Client, url: str, lines: int, timeout_s: float) -> tuple[str, float]:
    """Job id, and the time the job appeared."""
    deadline = time.monotonic() + timeout_s
    appeared = None
    while True:
        job_id, got = job_lines(client, url)
        if job_id and appeared is None:
            appeared = time.perf_counter()
        if got >= lines:
            return job_id, appeared or time.perf_counter()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {got} of {lines} lines arrived")
        time.sleep(0.02)


def usage(proc: subprocess.Popen) -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of a child that has exited (wait4 gives its rusage)."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def throughput(lines: int, ranks: int, batch: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="faultline-bench-") as tmp:
        folder = Path(tmp)
        logs = folder / "logs"
        logs.mkdir()
        files = RankFiles(logs, ranks=ranks)
        files.write_lines(lines)
        files.close()
        size = sum(p.stat().st_size for p in logs.iterdir())
        server = ServerProcess(env_for(folder / "server"), cwd=str(ROOT))
        server.start()
        client = httpx.Client(timeout=30)
        try:
            began = time.perf_counter()
            sidecar = subprocess.Popen(sidecar_argv(server.url, logs, folder / "state", "--batch-bytes", batch),
                                       env=env_for(folder), cwd=ROOT, stdout=subprocess.DEVNULL)
            job_id, appeared = wait_for(client, server.url, files.lines_written, timeout_s=1200)
            done = time.perf_counter()
            sources = client.get(f"{server.url}/jobs/{job_id}/sources").json()["data"]
            exact = sorted((s["bytes"], s["lines"], s["crc32"]) for s in sources) == files.manifest()
            sidecar.send_signal(signal.SIGTERM)
            side_cpu, side_rss = usage(sidecar)
            server_proc = server.proc
            server_proc.send_signal(signal.SIGTERM)
            server_cpu, server_rss = usage(server_proc)
            server.proc = None
        finally:
            client.close()
            server.kill()
        seconds = done - appeared
        return {"lines": files.lines_written, "bytes": size, "ranks": ranks, "batch_bytes": batch,
                "seconds_from_job_creation": round(seconds, 3), "seconds_from_sidecar_start": round(done - began, 3),
                "lines_per_s": round(files.lines_written / seconds), "mb_per_s": round(size / seconds / 1e6, 1),
                "exactly_once": exact, "sidecar_cpu_s": round(side_cpu, 2), "sidecar_peak_rss_mb": round(side_rss, 1),
                "server_cpu_s": round(server_cpu, 2), "server_peak_rss_mb": round(server_rss, 1)}


def chaos(lines: int, ranks: int) -> dict:
    """The acceptance scenario at full size (see tests/service/test_live_acceptance.py)."""
    with tempfile.TemporaryDirectory(prefix="faultline-chaos-") as tmp:
        folder = Path(tmp)
        logs = folder / "logs"
        logs.mkdir()
        files = RankFiles(logs, ranks=ranks)
        server = ServerProcess(env_for(folder / "server"), cwd=str(ROOT))
        argv = sidecar_argv(server.url, logs, folder / "state", "--batch-bytes", "512K")
        client = httpx.Client(timeout=30)
        events = []

        def start_sidecar() -> subprocess.Popen:
            return subprocess.Popen(argv, env=env_for(folder), cwd=ROOT, stdout=subprocess.DEVNULL)

        def got() -> int:
            return job_lines(client, server.url)[1]

        def until(n: int) -> None:
            deadline = time.monotonic() + 600
            while got() < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stuck below {n} lines")
                time.sleep(0.05)

        began = time.perf_counter()
        server.start()
        sidecar = None
        try:
            fifth = lines // 5
            files.write_lines(fifth)
            sidecar = start_sidecar()
            until(1)
            files.write_lines(fifth)
            until(fifth // 2)
            sidecar.send_signal(signal.SIGKILL)
            sidecar.wait()
            events.append(("sidecar killed", got()))
            files.write_lines(fifth // 2)
            files.rotate()
            events.append(("rotation 1 (sidecar down)", files.lines_written))
            files.write_lines(fifth // 2)
            sidecar = start_sidecar()
            until(2 * fifth)
            files.write_lines(fifth // 2)
            server.kill()
            events.append(("server killed", files.lines_written))
            files.write_lines(fifth // 2)
            files.rotate()
            events.append(("rotation 2 (server down)", files.lines_written))
            files.write_lines(fifth // 2)
            server.start()
            files.write_lines(lines - files.lines_written)
            files.close()
            until(files.lines_written)
            job_id, received = job_lines(client, server.url)
            sources = client.get(f"{server.url}/jobs/{job_id}/sources").json()["data"]
            exact = sorted((s["bytes"], s["lines"], s["crc32"]) for s in sources) == files.manifest()
        finally:
            client.close()
            if sidecar is not None and sidecar.poll() is None:
                sidecar.send_signal(signal.SIGTERM)
                sidecar.wait(60)
            server.kill()
        return {"lines_written": files.lines_written, "lines_received": received, "files": len(sources),
                "rotations": files.rotations, "server_starts": server.starts, "exactly_once": exact and
                received == files.lines_written, "seconds": round(time.perf_counter() - began, 1),
                "events": events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", default="4M", help="the sidecar's --batch-bytes")
    parser.add_argument("--skip-chaos", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    results: dict = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                     "load_avg_1m": os.getloadavg()[0]}
    if not args.skip_throughput:
        results["throughput"] = figures = throughput(args.lines, args.ranks, args.batch)
        print(f"throughput: {figures['lines']:,} lines ({figures['bytes'] / 1e6:.0f} MB, {args.ranks} files) in "
              f"{figures['seconds_from_job_creation']:.2f} s: {figures['lines_per_s']:,} lines/s, "
              f"{figures['mb_per_s']} MB/s; exactly once: {figures['exactly_once']}; "
              f"sidecar {figures['sidecar_cpu_s']} CPU s, {figures['sidecar_peak_rss_mb']} MB peak; "
              f"server {figures['server_cpu_s']} CPU s, {figures['server_peak_rss_mb']} MB peak")
    if not args.skip_chaos:
        results["chaos"] = figures = chaos(args.lines, args.ranks)
        print(f"chaos: {figures['lines_written']:,} lines written, {figures['lines_received']:,} received in "
              f"{figures['files']} files after {figures['rotations']} rotations and {figures['server_starts']} "
              f"server starts; exactly once: {figures['exactly_once']} ({figures['seconds']} s)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sidecar.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"peak RSS of this driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
