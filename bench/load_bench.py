"""Load and fault benchmark: many clients post big logs and many live jobs stream theirs to
several replicas on one PostgreSQL, and the database is restarted in the middle of it.

    python -m bench.load_bench [--clients 50] [--log-mb 10] [--uploads 2] [--replicas 2]
                               [--sidecars 20] [--live-rate 500] [--workers 1]
                               [--restart-after 0.3] [--down-s 5] [--keep-dir DIR]

Starts a private PostgreSQL server (initdb on a free port: the shared server is never
restarted), `--replicas` real `faultline serve` processes on one database in it, then runs the
workloads at once against them, while a watcher polls every replica's /healthz. The
workloads start once every replica says its Failure Agent is built (the seconds it took, a new
store's one-time embedding of the knowledge base, are in `setup.failure_agent_warm_up_s`):

- `uploads`: `--clients` concurrent clients, each posting `--uploads` logs of `--log-mb` MB
  (half Megatron-LM style, filtered by the built-in packs; half MaxText, a format the Log
  Agent has to learn), round robin over the replicas, each upload with its own
  Idempotency-Key. A 503 or a dropped connection is retried (same key, next replica) until
  the upload is acknowledged; any other answer is an error.
- `sidecars`: `--sidecars` live jobs at once, each a real `faultline tail` process running
  its training command (bench/live_writer.py: a framework generator of fixtures/logs, in turn
  Megatron-LM, DeepSpeed, InternEvo, torchtitan, NeMo, HF Trainer, printing `--live-rate`
  lines/s to 8 rank files and the launcher's stdout, with stdio's block buffering), pointed
  at one replica each, in turn. They run until the other workloads are over; then each job
  fails (ECC error, CUDA OOM, NCCL timeout, CUDA error) or ends cleanly, and its sidecar
  delivers the rest and reports the exit status. The sidecars ride out the restart on their
  own (503s, backoff); nothing in the bench helps them.
- `restart`: once `--restart-after` of the uploads are acknowledged, the database is stopped
  (`pg_ctl -m fast`: every connection dropped), kept down `--down-s` seconds, started again.

Then every acknowledged upload is looked up in the database: it must be there exactly once,
with the diagnosis the client was given (none lost, none duplicated), and every diagnosis
must name the same root cause as a quiet run of the same log (no wrong answer under load).
Every file every live job wrote must be in the database exactly once (job_sources: one
entry per file, its bytes, line count and CRC-32 equal to the file's), every live job
finished with its command's exit status and a final diagnosis, the same root cause as
`faultline diagnose` gives for its files afterwards.

Figures: throughput (uploads/s, MB/s, live lines/s), latency p50/p90/p99/max of acknowledged
uploads (from the first attempt to the 200, retries included) and of live lines (from the
write to the first poll of the database that shows it, every `--poll-s`; and the sidecars'
own delivery summaries: acknowledgement and read-to-acknowledgement times), errors,
retries, the replicas' answers by route and status (from their access logs: any 5xx but a
503 is an error), peak RSS of each replica, sidecar and writer (VmHWM), and what /healthz
said while the database was down and how soon each replica was healthy again. Written to
stdout and bench/out/load_bench.json; `--keep-dir` keeps the replicas' logs and the live
jobs' files.

Workloads are independent coroutines over one Fleet (replicas + database) reporting into one
Recorder (WORKLOADS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psutil
import psycopg
from sqlalchemy import select

from bench.live_writer import vm_hwm_mb
from fixtures.logs.generators.frameworks import FRAMEWORKS
from fixtures.logs.unknown_formats import maxtext_log
from service.store.db import Database
from service.store.models import Job, JobSource
from tests.support.postgres_cluster import PostgresCluster, unavailable
from service.api.health import PROBE_INTERVAL_S
from tests.support.processes import serve_process

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
ADMIN_TOKEN = "load-bench-admin-4c8e1a7f3b2d"


# -- the logs ----------------------------------------------------------------------------------
def megatron_log(size: int, seed: int) -> bytes:
    """A Megatron-LM pretraining log of about `size` bytes, in the shapes LOG_FORMATS.md cites
    (torchrun `[defaultN]:` prefixes, NCCL INFO from every rank, iteration lines from the last
    rank, timers, checkpoint saves), ending the way a GPU failure ends a job: one rank's ECC
    error, then the NCCL watchdog timeouts of the others and torchrun's failure report."""
    rng = random.Random(seed)
    ranks, hosts = 8, [f"gpu-node-{rng.randint(1, 64):03d}" for _ in range(2)]
    out = [f"[default{r}]:{hosts[r // 4]}:{3100 + r}:{3100 + r} [{r % 4}] NCCL INFO NCCL_IB_HCA set to mlx5_{r % 4}"
           for r in range(ranks)]
    out += [f"[default0]:  {name} {'.' * (48 - len(name))} {value}" for name, value in (
        ("micro_batch_size", 2), ("global_batch_size", 1024), ("seq_length", 4096), ("lr", "0.0003"),
        ("tensor_model_parallel_size", 4), ("pipeline_model_parallel_size", 2), ("world_size", ranks))]
    loss, step, when = 7.9, 0, datetime(2025, 3, 31, 5, 54, 7)
    while sum(len(line) + 1 for line in out) < size:
        step += 10
        loss = max(1.6, loss * (0.9995 + rng.uniform(-0.0004, 0.0003)))
        when += timedelta(seconds=15.5)
        out.append(f"[default7]: [{when:%Y-%m-%d %H:%M:%S}] iteration {step:8d}/  242204 | consumed samples: "
                   f"{step * 1024:12d} | elapsed time per iteration (ms): {rng.uniform(1540, 1570):.1f} | "
                   f"throughput per GPU (TFLOP/s/GPU): {rng.uniform(132, 136):.1f} | learning rate: "
                   f"{3e-4 * min(1, step / 2000):.6E} | global batch size:  1024 | lm loss: {loss:.6E} | loss scale: "
                   f"1.0 | grad norm: {rng.uniform(0.8, 1.6):.3f} | number of skipped iterations:   0 | number of "
                   "nan iterations:   0 |")
        out.append(f"[default7]:time (ms) | forward-compute: {rng.uniform(190, 200):.2f} | backward-compute: "
                   f"{rng.uniform(70, 76):.2f} | optimizer: {rng.uniform(60, 66):.2f} | batch-generator: "
                   f"{rng.uniform(24, 27):.2f}")
        if step % 1000 == 0:
            out.append(f"[default0]:saving checkpoint at iteration {step:7d} to /ckpt/gpt-13b in torch_dist format")
            out.append(f"[default0]:  successfully saved checkpoint from iteration {step:7d} to /ckpt/gpt-13b "
                       "[ t 1/4, p 1/2 ]")
    bad = rng.randrange(ranks)
    out.append(f"[default{bad}]:[rank{bad}]: RuntimeError: CUDA error: uncorrectable ECC error encountered")
    out += [f"[default{r}]:[rank{r}]:[E ProcessGroupNCCL.cpp:1484] [PG 0 Rank {r}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={step * 6}, OpType=ALLREDUCE, NumelIn=262144000, "
            "NumelOut=262144000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
            for r in range(ranks) if r != bad]
    out.append(f"E0331 06:21:44.390000 3139541 torch/distributed/elastic/multiprocessing/api.py:874] failed "
               f"(exitcode: 1) local_rank: {bad} (pid: 3139623) of binary: /usr/bin/python3")
    return ("\n".join(out) + "\n").encode()


def maxtext_bytes(size: int, seed: int) -> bytes:
    """A MaxText (JAX on TPU pods) log of about `size` bytes ending in an out-of-memory error."""
    steps = max(100, int(2000 * size / 1.81e6))
    return maxtext_log(steps=steps, workers=4, seed=seed, failure="oom").text().encode()


# -- the fleet and what happens to it --------------------------------------------------------------
@dataclass
class Fleet:
    cluster: PostgresCluster
    database_url: str
    replicas: list[str]
    pids: list[int]
    folder: Path
    """Scratch space: the replicas' data, the live jobs' files."""
    started: float = field(default_factory=time.monotonic)
    wall_started: float = field(default_factory=time.time)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def wall(self, at: float) -> float:
        """The wall-clock time of a moment given by now() (the writers stamp their writes so)."""
        return self.wall_started + at


@dataclass
class Upload:
    client: int
    key: str
    log: str
    bytes: int
    started: float
    acked: float | None = None
    attempts: int = 0
    statuses: list[str] = field(default_factory=list)
    job_id: str | None = None
    reason: str | None = None
    error: str | None = None


@dataclass
class LiveJob:
    """A training job writing rank files, followed by its own `faultline tail`."""

    number: int
    name: str
    framework: str
    failure: str | None
    folder: Path
    replica: int
    proc: subprocess.Popen | None = field(default=None, repr=False)
    """Kept so that subprocess never reaps it: reap() collects its resource usage."""
    started: float = 0.0
    exited: float | None = None
    exit_code: int | None = None
    cpu_s: float | None = None
    peak_rss_mb: float | None = None
    error: str | None = None
    seen: list[tuple[float, int]] = field(default_factory=list)
    """(wall time, lines the database holds for the job), polled."""

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("rank*.log")) + [self.tee]

    @property
    def tee(self) -> Path:
        return self.folder / "launcher.log"


@dataclass
class Recorder:
    uploads: list[Upload] = field(default_factory=list)
    live: list[LiveJob] = field(default_factory=list)
    health: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, replica, /healthz status; 0 when it did not answer in time)."""
    health_latency: list[float] = field(default_factory=list)
    health_said: dict[int, dict] = field(default_factory=dict)
    """The first unhealthy answer of each replica."""
    events: dict[str, float] = field(default_factory=dict)
    acked: int = 0


async def upload_clients(fleet: Fleet, rec: Recorder, args: argparse.Namespace, logs: dict[str, bytes]) -> None:
    names = sorted(logs)
    total = args.clients * args.uploads

    async def client(number: int, http: httpx.AsyncClient) -> None:
        for i in range(args.uploads):
            name = names[(number + i) % len(names)]
            up = Upload(client=number, key=f"load-{number:03d}-{i:03d}-{os.getpid()}", log=name,
                        bytes=len(logs[name]), started=fleet.now())
            rec.uploads.append(up)
            replica = (number + i) % len(fleet.replicas)
            while up.acked is None and up.error is None:
                up.attempts += 1
                url = fleet.replicas[replica]
                try:
                    r = await http.post(f"{url}/diagnose", params={"job_name": f"{name}-load-{number:03d}"},
                                        content=logs[name], headers={"Content-Type": "text/plain",
                                                                     "Idempotency-Key": up.key})
                except httpx.TransportError as exc:
                    up.statuses.append(type(exc).__name__)
                else:
                    up.statuses.append(str(r.status_code))
                    if r.status_code == 200:
                        body = r.json()
                        up.acked, up.job_id = fleet.now(), body["job_id"]
                        up.reason = (body.get("root_cause") or {}).get("reason")
                        rec.acked += 1
                        break
                    if r.status_code != 503:
                        up.error = f"{r.status_code}: {r.text[:200]}"
                        break
                if fleet.now() - up.started > args.give_up_s:
                    up.error = f"gave up after {up.attempts} attempts: {up.statuses[-3:]}"
                    break
                replica = (replica + 1) % len(fleet.replicas)
                await asyncio.sleep(0.5 + random.random())
        if rec.acked >= total:
            rec.events.setdefault("uploads_done", fleet.now())

    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.give_up_s, connect=10), limits=limits) as http:
        await asyncio.gather(*(client(n, http) for n in range(args.clients)))
    rec.events["uploads_done"] = fleet.now()


async def restart_database(fleet: Fleet, rec: Recorder, args: argparse.Namespace, _logs: dict) -> None:
    total = args.clients * args.uploads
    if "uploads" in args.workloads:
        while rec.acked < args.restart_after * total and "uploads_done" not in rec.events:
            await asyncio.sleep(0.1)
    else:  # the live jobs alone: that share of their shortest run
        await asyncio.sleep(args.restart_after * args.live_min_s)
    if "uploads_done" in rec.events:
        rec.events["restart_skipped_run_ended"] = fleet.now()
        return
    await asyncio.to_thread(fleet.cluster.stop, "fast")
    rec.events["db_stopped"] = fleet.now()
    await asyncio.sleep(args.down_s)
    rec.events["db_starting"] = fleet.now()  # from here on the server may accept connections
    await asyncio.to_thread(fleet.cluster.start)
    rec.events["db_started"] = fleet.now()


async def watch_health(fleet: Fleet, rec: Recorder, done: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=2) as http:
        while not done.is_set():
            for i, url in enumerate(fleet.replicas):
                sent = fleet.now()  # when asked: an answer may arrive after the database stopped
                try:
                    answer = await http.get(f"{url}/healthz")
                    status = answer.status_code
                    if status != 200 and i not in rec.health_said:
                        rec.health_said[i] = answer.json()
                except httpx.TransportError:
                    status = 0
                rec.health.append((sent, i, status))
                rec.health_latency.append(fleet.now() - sent)
            await asyncio.sleep(0.25)


# -- live jobs --------------------------------------------------------------------------------------
LIVE_FAILURES = ("ecc_error", "out_of_memory", "nccl_timeout", "cuda_error", None)
"""How the live jobs end, in turn (None: a clean end, exit 0); five against six frameworks,
so the pairings vary."""


def sidecar_argv(job: LiveJob, server: str, args: argparse.Namespace) -> list[str]:
    """`faultline tail` running the job's command, as a Slurm batch script would start it."""
    writer = [sys.executable, "-m", "bench.live_writer", "--dir", str(job.folder), "--framework", job.framework,
              "--failure", job.failure or "none", "--seed", str(job.number), "--rate", str(args.live_rate),
              "--stop-file", str(job.folder / "stop"), "--journal", str(job.folder / "journal.json")]
    return [sys.executable, "-m", "service.cli", "tail", "--server", server, "--job-name", job.name,
            "--framework", job.framework, "--state-dir", str(job.folder / "state"), "--tee", str(job.tee),
            "--drain-timeout", str(args.give_up_s), str(job.folder / "rank*.log"), "--", *writer]


def reap(job: LiveJob, fleet: Fleet) -> bool:
    """Collects an exited sidecar (its exit status and CPU time); notes the peak memory of a
    running one (VmHWM, sampled: ru_maxrss would count the bench's own memory, which the
    sidecar held before exec)."""
    pid, status, usage = os.wait4(job.proc.pid, os.WNOHANG)
    if pid == 0:
        try:
            job.peak_rss_mb = max(job.peak_rss_mb or 0.0, vm_hwm_mb(job.proc.pid))
        except (OSError, ValueError):
            pass  # it is exiting
        return False
    job.exited, job.exit_code = fleet.now(), os.waitstatus_to_exitcode(status)
    job.proc.returncode = job.exit_code
    job.cpu_s = round(usage.ru_utime + usage.ru_stime, 2)
    return True


def poll_visible(fleet: Fleet, rec: Recorder, conn: list[psycopg.Connection]) -> None:
    """What the database holds for each live job now (what GET /jobs/{id} would answer)."""
    names = [job.name for job in rec.live]
    try:
        if not conn:
            conn.append(psycopg.connect(fleet.database_url.replace("+psycopg", ""), autocommit=True,
                                        connect_timeout=2))
        rows = conn[0].execute("SELECT name, lines_received FROM jobs WHERE live AND name = ANY(%s)",
                               (names,)).fetchall()
    except psycopg.Error:
        for c in conn:
            c.close()
        conn.clear()
        return
    now = time.time()
    by_name = {job.name: job for job in rec.live}
    for name, lines in rows:
        by_name[name].seen.append((now, lines))


async def live_sidecars(fleet: Fleet, rec: Recorder, args: argparse.Namespace, _logs: dict) -> None:
    """`--sidecars` jobs at once, each a writer of rank files under its own `faultline tail`
    (one replica each, in turn), until the other workloads are over; then every job ends
    (fails, or finishes cleanly) and its sidecar delivers the rest and reports the exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(PYTHONPATH=str(ROOT), FAULTLINE_DATA_DIR=str(fleet.folder / "sidecars"))
    frameworks = sorted(FRAMEWORKS)
    for n in range(args.sidecars):
        framework, failure = frameworks[n % len(frameworks)], LIVE_FAILURES[n % len(LIVE_FAILURES)]
        job = LiveJob(n, f"live-{framework}-{n:02d}-{os.getpid()}", framework, failure,
                      fleet.folder / "live" / f"job{n:02d}", n % len(fleet.replicas))
        job.folder.mkdir(parents=True)
        with open(job.folder / "sidecar.err", "wb") as err:
            job.proc = subprocess.Popen(sidecar_argv(job, fleet.replicas[job.replica], args), env=env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=err)
        job.started = fleet.now()
        rec.live.append(job)
    rec.events["live_started"] = fleet.now()
    conn: list[psycopg.Connection] = []

    def others_done() -> bool:
        uploads = "uploads" not in args.workloads or "uploads_done" in rec.events
        restart = "restart" not in args.workloads or any(
            k in rec.events for k in ("db_started", "restart_skipped_run_ended"))
        return uploads and restart and fleet.now() - rec.events["live_started"] >= args.live_min_s

    try:
        while not others_done():
            await asyncio.to_thread(poll_visible, fleet, rec, conn)
            for job in rec.live:
                if job.exited is None and reap(job, fleet):  # else it notes its peak memory so far
                    job.error = f"the sidecar exited ({job.exit_code}) while its job ran"
            await asyncio.sleep(args.poll_s)
        rec.events["live_stopping"] = fleet.now()
        for job in rec.live:
            (job.folder / "stop").touch()
        while running := [job for job in rec.live if job.exited is None]:
            await asyncio.to_thread(poll_visible, fleet, rec, conn)
            for job in running:
                reap(job, fleet)
            if fleet.now() - rec.events["live_stopping"] > args.give_up_s:
                break
            await asyncio.sleep(args.poll_s)
        await asyncio.to_thread(poll_visible, fleet, rec, conn)
    finally:
        for c in conn:
            c.close()
        for job in rec.live:
            if job.exited is None:  # given up on, or the bench itself failed: leave nothing running
                job.error = job.error or "the sidecar did not exit in time"
                (job.folder / "stop").touch()
                job.proc.kill()
                job.proc.wait()
                job.exited = fleet.now()
    rec.events["live_done"] = fleet.now()


Workload = Callable[[Fleet, Recorder, argparse.Namespace, dict], Awaitable[None]]
WORKLOADS: dict[str, Workload] = {"uploads": upload_clients, "restart": restart_database, "sidecars": live_sidecars}


# -- checks and figures ----------------------------------------------------------------------------
def peak_rss_mb(pid: int) -> float:
    """Peak resident memory of a replica: its process and its uvicorn workers (VmHWM)."""
    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def check_store(fleet: Fleet, rec: Recorder) -> dict:
    acked = {u.key: u for u in rec.uploads if u.acked is not None}
    db = Database(fleet.database_url)
    try:
        with db.session() as session:
            rows = session.execute(select(Job.idempotency_key, Job.id, Job.reason, Job.diagnosis)
                                   .where(Job.idempotency_key.in_(list(acked)))).all()
            jobs_total = len(session.scalars(select(Job.id)).all())
    finally:
        db.close()
    found = {key: (job_id, reason, diagnosis) for key, job_id, reason, diagnosis in rows}
    lost = [k for k, u in acked.items() if k not in found or found[k][0] != u.job_id or found[k][2] is None]
    wrong = [k for k, u in acked.items() if k in found and found[k][1] != u.reason]
    return {"acknowledged": len(acked), "stored": len(found), "lost": len(lost), "stored_differently": len(wrong),
            "jobs_in_database": jobs_total, "lost_keys": lost[:10]}


# -- live jobs: checks and figures -------------------------------------------------------------
def file_manifest(path: Path) -> dict:
    """Bytes, lines (as the service counts them: LF, CR and CRLF end a line) and CRC-32."""
    size = lines = crc = 0
    ended_cr = False
    with open(path, "rb") as handle:
        while data := handle.read(1 << 20):
            size += len(data)
            crc = zlib.crc32(data, crc)
            lines += data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
            if ended_cr and data.startswith(b"\n"):
                lines -= 1
            ended_cr = data.endswith(b"\r")
    return {"bytes": size, "lines": lines, "crc32": f"{crc:08x}"}


def quiet_diagnosis(job: LiveJob, folder: Path) -> str | None:
    """The reason `faultline diagnose` gives for the same files, with nothing else going on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(PYTHONPATH=str(ROOT), FAULTLINE_DATA_DIR=str(folder), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "service.cli", "diagnose", "--json", "--job-name", job.name,
                           "--framework", job.framework, *map(str, job.files())],
                          env=env, cwd=ROOT, capture_output=True, timeout=600)
    if done.returncode != 0:
        return f"faultline diagnose failed ({done.returncode}): {done.stderr.decode(errors='replace')[-200:]}"
    return (json.loads(done.stdout).get("root_cause") or {}).get("reason")


def visibility_latencies(timeline: list[list[float]], seen: list[tuple[float, int]]
                         ) -> tuple[list[tuple[float, float]], int]:
    """For every round of writes: from the write to the first poll showing all its lines in the
    database. Returns (write time, latency) pairs and the rounds never seen (none once a job
    has finished)."""
    out, missed, j = [], 0, 0
    previous = 0
    for when, lines in timeline:
        if lines <= previous:
            continue
        previous = lines
        while j < len(seen) and (seen[j][0] < when or seen[j][1] < lines):
            j += 1  # too early or too few for this round, so for every later one too
        if j == len(seen):
            missed += 1
            continue
        out.append((when, seen[j][0] - when))
    return out, missed


SIDECAR_SUMMARY = re.compile(
    r"delivered (\d+) lines in (\d+) batches; acknowledgement (?:p50 ([\d.]+) s, p99 ([\d.]+) s, max ([\d.]+) s|none); "
    r"read to acknowledgement (?:p50 ([\d.]+) s, p99 ([\d.]+) s, max ([\d.]+) s|none); (\d+) retries")
SIDECAR_RETRY = re.compile(r"server unavailable \((HTTP \d+|[A-Za-z]+)")
SIDECAR_ROUTINE = ("following ", "server expects byte")


def sidecar_log(path: Path) -> dict:
    """What a sidecar said: its summary, why it retried, and anything unexpected."""
    text = path.read_text(errors="replace")
    summary = SIDECAR_SUMMARY.search(text)
    retries: dict[str, int] = {}
    unexpected = []
    for line in text.splitlines():
        message = line.removeprefix("faultline tail: ")
        retry = SIDECAR_RETRY.search(message)
        if retry:
            retries[retry.group(1)] = retries.get(retry.group(1), 0) + 1
        elif not (message.startswith(SIDECAR_ROUTINE) or SIDECAR_SUMMARY.search(message)
                  or re.fullmatch(r"job \w+ \(.*\)|job \w+ finished: .*", message)):
            unexpected.append(message[:300])
    figures = None
    if summary:
        g = [float(x) if x is not None else None for x in summary.groups()]
        figures = {"lines": int(g[0]), "batches": int(g[1]), "ack_p50": g[2], "ack_p99": g[3], "ack_max": g[4],
                   "read_to_ack_p50": g[5], "read_to_ack_p99": g[6], "read_to_ack_max": g[7], "retries": int(g[8])}
    return {"summary": figures, "retries": retries, "unexpected": unexpected,
            "resyncs": text.count("server expects byte")}


def check_live(fleet: Fleet, rec: Recorder) -> dict:
    """Every line every writer wrote is in the database exactly once, per file by count and
    CRC-32; every job finished, with the exit status of its command and a diagnosis."""
    if not rec.live:
        return {}
    db = Database(fleet.database_url)
    try:
        with db.session() as session:
            jobs = session.execute(select(Job.name, Job.id, Job.finished_at, Job.exit_code, Job.status, Job.reason,
                                          Job.diagnosis, Job.lines_received)
                                   .where(Job.live.is_(True), Job.name.in_([j.name for j in rec.live]))).all()
            ids = [row.id for row in jobs]
            sources = session.execute(select(JobSource).where(JobSource.job_id.in_(ids))).scalars().all()
            received = {(r.job_id, Path(r.source).name): [] for r in sources}
            for r in sources:
                received[(r.job_id, Path(r.source).name)].append(
                    (r.first_offset, r.next_offset, r.bytes, r.lines, f"{r.crc32:08x}"))
    finally:
        db.close()
    by_name: dict[str, list] = {}
    for row in jobs:
        by_name.setdefault(row.name, []).append(row)
    problems: list[str] = []
    lost = duplicated = files_checked = files_exact = lines_expected = bytes_expected = 0
    per_job = []
    quiet = fleet.folder / "quiet-diagnose"
    for job in rec.live:
        journal = json.loads((job.folder / "journal.json").read_text()) \
            if (job.folder / "journal.json").exists() else None
        rows = by_name.get(job.name, [])
        if len(rows) != 1:
            problems.append(f"{job.name}: {len(rows)} live jobs of that name")
        row = rows[0] if rows else None
        expected = {path.name: file_manifest(path) for path in job.files()}
        if journal is not None:
            wrote = {("launcher.log" if p == "<stdout>" else Path(p).name): f for p, f in journal["files"].items()}
            if wrote != expected:
                problems.append(f"{job.name}: the files on disk differ from what the writer wrote")
        exact = True
        for name, want in expected.items():
            files_checked += 1
            lines_expected += want["lines"]
            bytes_expected += want["bytes"]
            got = received.get((row.id, name), []) if row else []
            got_lines = sum(g[3] for g in got)
            lost += max(0, want["lines"] - got_lines)
            duplicated += max(0, got_lines - want["lines"])
            whole = [(0, want["bytes"], want["bytes"], want["lines"], want["crc32"])] if want["bytes"] else []
            if got == whole:
                files_exact += 1
            else:
                exact = False
                problems.append(f"{job.name}/{name}: wrote {want}, the database has {got}")
        extra = {name for (job_id, name) in received if row and job_id == row.id} - set(expected)
        if extra:
            problems.append(f"{job.name}: sources nobody wrote: {sorted(extra)}")
        diagnosis = (row.diagnosis or {}) if row else {}
        reason = (diagnosis.get("root_cause") or {}).get("reason")
        quiet_reason = quiet_diagnosis(job, quiet)
        if reason != quiet_reason:
            problems.append(f"{job.name}: diagnosed {reason} live, {quiet_reason} by a quiet run of its files")
        if journal is None:
            problems.append(f"{job.name}: its command left no journal (it never ended)")
        want_code = journal["exit_code"] if journal else None
        if row is None or row.finished_at is None:
            problems.append(f"{job.name}: not finished")
        elif row.exit_code != want_code or job.exit_code != want_code:
            problems.append(f"{job.name}: exit code {row.exit_code} stored, {job.exit_code} from the sidecar, "
                            f"{want_code} from the command")
        if row is not None and (not diagnosis or diagnosis.get("status") not in ("failed", "healthy")):
            problems.append(f"{job.name}: no final diagnosis ({diagnosis.get('status')})")
        if row is not None and row.lines_received != sum(f["lines"] for f in expected.values()):
            problems.append(f"{job.name}: lines_received {row.lines_received}, "
                            f"{sum(f['lines'] for f in expected.values())} written")
        if job.error:
            problems.append(f"{job.name}: {job.error}")
        per_job.append({"name": job.name, "framework": job.framework, "failure": job.failure,
                        "replica": job.replica, "exit_code": row.exit_code if row else None,
                        "status": row.status if row else None, "reason": reason,
                        "quiet_reason": quiet_reason,
                        "generator_reason": journal["reason"] if journal else None,
                        "lines": sum(f["lines"] for f in expected.values()),
                        "mb": round(sum(f["bytes"] for f in expected.values()) / 1e6, 2),
                        "files": len(expected), "exactly_once": exact})
    return {"jobs": len(rec.live), "files": files_checked, "files_exactly_once": files_exact,
            "lines_written": lines_expected, "bytes_written": bytes_expected,
            "lost_lines": lost, "duplicated_lines": duplicated, "problems": problems, "per_job": per_job}


def live_figures(fleet: Fleet, rec: Recorder, live_check: dict) -> dict:
    if not rec.live:
        return {}
    latencies: list[tuple[float, float]] = []
    missed = 0
    writer_cpu, writer_rss = [], []
    for job in rec.live:
        path = job.folder / "journal.json"
        if not path.exists():
            continue
        journal = json.loads(path.read_text())
        found, never = visibility_latencies(journal["timeline"], job.seen)
        latencies += found
        missed += never
        writer_cpu.append(journal["cpu_s"])
        writer_rss.append(journal["peak_rss_mb"])
    logs = [sidecar_log(job.folder / "sidecar.err") for job in rec.live]
    summaries = [log["summary"] for log in logs if log["summary"]]
    retries: dict[str, int] = {}
    for log in logs:
        for why, n in log["retries"].items():
            retries[why] = retries.get(why, 0) + n
    began, ended = rec.events.get("live_started", 0.0), rec.events.get("live_done", 0.0)
    seconds = max(ended - began, 1e-9)
    down = (fleet.wall(rec.events["db_stopped"]), fleet.wall(rec.events["db_started"])) \
        if "db_stopped" in rec.events and "db_started" in rec.events else None

    def latency(samples: list[float]) -> dict:
        return {"p50": percentile(samples, 0.5), "p90": percentile(samples, 0.9), "p99": percentile(samples, 0.99),
                "max": round(max(samples, default=0), 2), "samples": len(samples)}

    per_job = live_check.get("per_job", [])

    def spread(key: str) -> dict:
        values = [s[key] for s in summaries if s[key] is not None]
        return {"median": percentile(values, 0.5), "max": round(max(values, default=float("nan")), 3)}

    return {
        "seconds": round(seconds, 1),
        "lines_per_s": round(live_check.get("lines_written", 0) / seconds),
        "mb_per_s": round(live_check.get("bytes_written", 0) / 1e6 / seconds, 2),
        "write_to_visible_s": {**latency([lag for _, lag in latencies]), "never_seen": missed},
        "write_to_visible_s_written_while_db_down": latency(
            [lag for when, lag in latencies if down and down[0] <= when <= down[1]]),
        "sidecar_ack_s": {"p50_per_sidecar": spread("ack_p50"), "p99_per_sidecar": spread("ack_p99"),
                          "max": spread("ack_max")["max"]},
        "sidecar_read_to_ack_s": {"p50_per_sidecar": spread("read_to_ack_p50"),
                                  "p99_per_sidecar": spread("read_to_ack_p99"),
                                  "max": spread("read_to_ack_max")["max"]},
        "sidecar_retries": retries,
        "sidecar_resyncs": sum(log["resyncs"] for log in logs),
        "sidecar_unexpected_messages": [m for log in logs for m in log["unexpected"]][:10],
        "sidecar_exit_codes": sorted(job.exit_code for job in rec.live if job.exit_code is not None),
        "sidecar_peak_rss_mb": {"max": max((j.peak_rss_mb or 0 for j in rec.live), default=0),
                                "median": percentile([j.peak_rss_mb or 0 for j in rec.live], 0.5)},
        "sidecar_cpu_s": {"total": round(sum(j.cpu_s or 0 for j in rec.live), 1),
                          "max": max((j.cpu_s or 0 for j in rec.live), default=0)},
        "writer_cpu_s_total": round(sum(writer_cpu), 1),
        "writer_peak_rss_mb_max": max(writer_rss, default=0),
        "diagnosis_same_as_quiet": sum(j["reason"] == j["quiet_reason"] for j in per_job),
        "diagnosis_names_the_generators_failure": sum(j["reason"] == j["generator_reason"] for j in per_job),
    }


def replica_answers(folder: Path, replicas: int) -> dict:
    """Status codes the replicas answered, by route, from their access logs."""
    pattern = re.compile(r'"(GET|POST) (/[^ ?]*)[^"]* HTTP/1\.1" (\d{3})')
    counts: dict[str, dict[str, int]] = {}
    for i in range(replicas):
        for line in (folder / f"replica{i}.log").read_text(errors="replace").splitlines():
            match = pattern.search(line)
            if not match:
                continue
            route = re.sub(r"^/jobs/[^/]+", "/jobs/{id}", match.group(2))
            by_status = counts.setdefault(f"{match.group(1)} {route}", {})
            by_status[match.group(3)] = by_status.get(match.group(3), 0) + 1
    return counts


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def health_summary(fleet: Fleet, rec: Recorder) -> dict:
    stopped, starting, started = (rec.events.get(k) for k in ("db_stopped", "db_starting", "db_started"))
    if stopped is None or starting is None or started is None:
        return {}
    out = []
    for i in range(len(fleet.replicas)):
        samples = [(t, s) for t, r, s in rec.health if r == i]
        during = [(t, s) for t, s in samples if stopped <= t < starting]
        first_503 = next((t for t, s in during if s == 503), None)
        # /healthz answers from a probe that checks every PROBE_INTERVAL_S: the first answers
        # after the stop may still say what the last check saw
        down = [(t, s) for t, s in during if t >= stopped + PROBE_INTERVAL_S + 0.5]
        healthy_again = next((t for t, s in samples if t > started and s == 200), None)
        out.append({"replica": i, "samples_while_down": len(during),
                    "answers_while_down": sorted({s for _, s in down}), "said": rec.health_said.get(i),
                    "unhealthy_after_s": round(first_503 - stopped, 2) if first_503 is not None else None,
                    "healthy_again_after_start_s": round(healthy_again - started, 2) if healthy_again else None})
    return {"db_down_s": round(starting - stopped, 2), "replicas": out}


def report(fleet: Fleet, rec: Recorder, args: argparse.Namespace, logs: dict[str, bytes],
           expected: dict[str, str | None], wall_s: float, load_before: list[float]) -> dict:
    acked = [u for u in rec.uploads if u.acked is not None]
    live_check = check_live(fleet, rec)
    latencies = [u.acked - u.started for u in acked]
    during = [u for u in acked if rec.events.get("db_stopped") is not None
              and u.started <= rec.events.get("db_started", 0) and u.acked >= rec.events["db_stopped"]]
    moved = sum(u.bytes for u in acked)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {"workloads": args.workloads, "clients": args.clients, "uploads_per_client": args.uploads,
                  "log_mb": args.log_mb, "replicas": args.replicas, "workers_per_replica": args.workers,
                  "sidecars": args.sidecars if "sidecars" in args.workloads else 0,
                  "live_lines_per_s_per_job": args.live_rate, "cpus": os.cpu_count(),
                  "load_avg_before": load_before, "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                  "logs": {name: round(len(data) / 1e6, 2) for name, data in logs.items()},
                  "expected_reason": expected},
        "throughput": {"wall_s": round(wall_s, 1), "uploads_per_s": round(len(acked) / wall_s, 2),
                       "mb_per_s": round(moved / 1e6 / wall_s, 1)},
        "latency_s": {"p50": percentile(latencies, 0.50), "p90": percentile(latencies, 0.90),
                      "p99": percentile(latencies, 0.99), "max": round(max(latencies, default=0), 2)},
        "healthz_latency_s": {"p50": percentile(rec.health_latency, 0.5), "p99": percentile(rec.health_latency, 0.99),
                              "max": round(max(rec.health_latency, default=0), 2)},
        "errors": sum(u.error is not None for u in rec.uploads),
        "error_samples": [u.error for u in rec.uploads if u.error][:5],
        "retried_uploads": sum(u.attempts > 1 for u in rec.uploads),
        "attempts": sum(u.attempts for u in rec.uploads),
        "retry_answers": sorted({s for u in rec.uploads for s in u.statuses if s != "200"}),
        "wrong_reason_under_load": sum(u.reason != expected[u.log] for u in acked),
        "uploads_in_flight_across_the_restart": len(during),
        "store": check_store(fleet, rec),
        "events_s": rec.events,
        "database_restart": {**{k: v for k, v in rec.events.items() if k.startswith(("db_", "restart"))},
                             **health_summary(fleet, rec)},
        "peak_rss_mb": {f"replica{i}": peak_rss_mb(pid) for i, pid in enumerate(fleet.pids)},
        "client_peak_rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "live": {**live_figures(fleet, rec, live_check),
                 "store": {k: v for k, v in live_check.items() if k != "per_job"},
                 "jobs": live_check.get("per_job", [])} if rec.live else None,
    }


# -- running it ---------------------------------------------------------------------------------------
WARM_ANSWERS = 8
"""Consecutive /healthz answers saying the Failure Agent is ready: each worker of a replica
answers some of them, and each builds its own agent."""


def wait_until_warm(url: str, timeout_s: float = 600.0) -> float:
    """Seconds until the replica's workers have built the Failure Agent (the embedding model
    loaded, the knowledge base embedded: a new store's first start embeds every seeded
    incident, minutes of CPU). The figures are the service's steady state, not its first start,
    which is reported apart."""
    began = time.monotonic()
    streak = 0
    while time.monotonic() - began < timeout_s:
        state = httpx.get(f"{url}/healthz", timeout=10).json().get("failure_agent")
        if state in ("loading",):
            streak = 0
        else:
            streak += 1
            if streak >= WARM_ANSWERS:
                break
        time.sleep(0.25 if streak else 1.0)
    return round(time.monotonic() - began, 1)


def quiet_reasons(url: str, logs: dict[str, bytes]) -> dict[str, str | None]:
    """What each log's diagnosis says with nothing else going on."""
    out = {}
    for name, data in logs.items():
        r = httpx.post(f"{url}/diagnose", params={"job_name": f"{name}-quiet"}, content=data,
                       headers={"Content-Type": "text/plain"}, timeout=600)
        r.raise_for_status()
        out[name] = (r.json().get("root_cause") or {}).get("reason")
    return out


async def run_workloads(fleet: Fleet, rec: Recorder, args: argparse.Namespace, logs: dict[str, bytes]) -> None:
    done = asyncio.Event()
    watcher = asyncio.create_task(watch_health(fleet, rec, done))
    try:
        await asyncio.gather(*(WORKLOADS[name](fleet, rec, args, logs) for name in args.workloads))
    finally:
        done.set()
        await watcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--uploads", type=int, default=2, help="uploads per client")
    parser.add_argument("--log-mb", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica")
    parser.add_argument("--restart-after", type=float, default=0.3,
                        help="restart the database once this share of the uploads is acknowledged")
    parser.add_argument("--down-s", type=float, default=5.0, help="how long the database stays down")
    parser.add_argument("--give-up-s", type=float, default=900.0, help="an upload not acknowledged by then is an error")
    parser.add_argument("--sidecars", type=int, default=20, help="live jobs, each followed by its own sidecar")
    parser.add_argument("--live-rate", type=float, default=500.0, help="lines per second each live job prints")
    parser.add_argument("--live-min-s", type=float, default=30.0, help="the live jobs run at least this long")
    parser.add_argument("--poll-s", type=float, default=0.25,
                        help="how often the live jobs' line counts are read from the database")
    parser.add_argument("--workloads", nargs="+", default=["uploads", "sidecars", "restart"], choices=sorted(WORKLOADS))
    parser.add_argument("--server-env", action="append", default=[], metavar="FAULTLINE_X=V",
                        help="a setting for every replica (repeatable), e.g. FAULTLINE_MAX_CONCURRENT_UPLOADS=2")
    parser.add_argument("--out", type=Path, default=OUT / "load_bench.json")
    parser.add_argument("--keep-dir", type=Path, default=None,
                        help="a new folder for the replicas' logs and the live jobs' files, kept afterwards")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        sys.stderr.write(f"load_bench: cannot start a private PostgreSQL server: {reason}\n")
        return 2
    size = int(args.log_mb * 1e6)
    logs = {"megatron": megatron_log(size, seed=7), "maxtext": maxtext_bytes(size, seed=8)}
    with ExitStack() as stack:
        cluster = stack.enter_context(PostgresCluster())
        url = cluster.create_database("faultline")
        if args.keep_dir is not None:
            args.keep_dir.mkdir(parents=True)  # a new folder: the live jobs' files must not exist yet
            folder = args.keep_dir
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faultline-load-")))
        env = {"FAULTLINE_DATABASE_URL": url, "FAULTLINE_ADMIN_TOKEN": ADMIN_TOKEN,
               "FAULTLINE_DB_CONNECT_TIMEOUT_S": "2", **dict(item.split("=", 1) for item in args.server_env)}
        replicas, pids = [], []
        for i in range(args.replicas):
            replica = stack.enter_context(serve_process(
                {**env, "FAULTLINE_DATA_DIR": str(folder / f"replica{i}")}, workers=args.workers,
                log_path=folder / f"replica{i}.log"))
            replicas.append(replica.url)
            pids.append(replica.pid)
        warm_up_s = {f"replica{i}": wait_until_warm(url) for i, url in enumerate(replicas)}
        expected = quiet_reasons(replicas[0], logs)
        fleet = Fleet(cluster, url, replicas, pids, folder)
        rec = Recorder()
        load_before = [round(x, 2) for x in os.getloadavg()]
        began = time.monotonic()
        asyncio.run(run_workloads(fleet, rec, args, logs))
        wall = time.monotonic() - began
        result = report(fleet, rec, args, logs, expected, wall, load_before)
        result["setup"]["failure_agent_warm_up_s"] = warm_up_s
        tracebacks = sum((folder / f"replica{i}.log").read_text(errors="replace").count("Traceback")
                         for i in range(args.replicas))
        result["server_tracebacks"] = tracebacks
        result["replica_answers"] = answers = replica_answers(folder, args.replicas)
        result["server_errors"] = sum(n for by_status in answers.values() for status, n in by_status.items()
                                      if status.startswith("5") and status != "503")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    ok = result["errors"] == 0 and result["store"]["lost"] == 0 and result["wrong_reason_under_load"] == 0
    ok = ok and result["server_errors"] == 0 and result["server_tracebacks"] == 0
    live = result["live"]
    if live is not None:
        ok = ok and not live["store"]["problems"] and live["store"]["lost_lines"] == 0 \
            and live["store"]["duplicated_lines"] == 0 and not live["sidecar_unexpected_messages"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
