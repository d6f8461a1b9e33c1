"""Load and fault benchmark: many clients post big logs to several replicas on one PostgreSQL,
and the database is restarted in the middle of it.

    python -m bench.load_bench [--clients 50] [--log-mb 10] [--uploads 2] [--replicas 2]
                               [--workers 1] [--restart-after 0.3] [--down-s 5]

Starts a private PostgreSQL server (initdb on a free port: the shared server is never
restarted), `--replicas` real `faultline serve` processes on one database in it, then runs the
workloads at once against them, while a watcher polls every replica's /healthz:

- `uploads`: `--clients` concurrent clients, each posting `--uploads` logs of `--log-mb` MB
  (half Megatron-LM style, filtered by the built-in packs; half MaxText, a format the Log
  Agent has to learn), round robin over the replicas, each upload with its own
  Idempotency-Key. A 503 or a dropped connection is retried (same key, next replica) until
  the upload is acknowledged; any other answer is an error.
- `restart`: once `--restart-after` of the uploads are acknowledged, the database is stopped
  (`pg_ctl -m fast`: every connection dropped), kept down `--down-s` seconds, started again.

Then every acknowledged upload is looked up in the database: it must be there exactly once,
with the diagnosis the client was given (none lost, none duplicated), and every diagnosis
must name the same root cause as a quiet run of the same log (no wrong answer under load).

Figures: throughput (uploads/s, MB/s), latency p50/p90/p99/max of acknowledged uploads (from
the first attempt to the 200, retries included), errors, retries, peak RSS of each replica
(VmHWM of its processes), and what /healthz said while the database was down and how soon
each replica was healthy again. Written to stdout and bench/out/load_bench.json.

Workloads are independent coroutines over one Fleet (replicas + database) reporting into one
Recorder: the live sidecars of the live-jobs work plug in as one more entry of WORKLOADS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psutil
from sqlalchemy import select

from fixtures.logs.unknown_formats import maxtext_log
from service.db import Database
from service.models import Job
from tests.support.postgres_cluster import PostgresCluster, unavailable
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
    started: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)


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
class Recorder:
    uploads: list[Upload] = field(default_factory=list)
    health: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, replica, /healthz status; 0 when it did not answer in time)."""
    health_latency: list[float] = field(default_factory=list)
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
    while rec.acked < args.restart_after * total and "uploads_done" not in rec.events:
        await asyncio.sleep(0.1)
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
                    status = (await http.get(f"{url}/healthz")).status_code
                except httpx.TransportError:
                    status = 0
                rec.health.append((sent, i, status))
                rec.health_latency.append(fleet.now() - sent)
            await asyncio.sleep(0.25)


Workload = Callable[[Fleet, Recorder, argparse.Namespace, dict], Awaitable[None]]
WORKLOADS: dict[str, Workload] = {"uploads": upload_clients, "restart": restart_database}


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
        down = [(t, s) for t, s in samples if stopped <= t < starting]
        first_503 = next((t for t, s in down if s == 503), None)
        healthy_again = next((t for t, s in samples if t > started and s == 200), None)
        out.append({"replica": i, "samples_while_down": len(down),
                    "answers_while_down": sorted({s for _, s in down}),
                    "unhealthy_after_s": round(first_503 - stopped, 2) if first_503 is not None else None,
                    "healthy_again_after_start_s": round(healthy_again - started, 2) if healthy_again else None})
    return {"db_down_s": round(starting - stopped, 2), "replicas": out}


def report(fleet: Fleet, rec: Recorder, args: argparse.Namespace, logs: dict[str, bytes],
           expected: dict[str, str | None], wall_s: float) -> dict:
    acked = [u for u in rec.uploads if u.acked is not None]
    latencies = [u.acked - u.started for u in acked]
    during = [u for u in acked if rec.events.get("db_stopped") is not None
              and u.started <= rec.events.get("db_started", 0) and u.acked >= rec.events["db_stopped"]]
    moved = sum(u.bytes for u in acked)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {"clients": args.clients, "uploads_per_client": args.uploads, "log_mb": args.log_mb,
                  "replicas": args.replicas, "workers_per_replica": args.workers, "cpus": os.cpu_count(),
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
        "database_restart": {**{k: v for k, v in rec.events.items() if k.startswith(("db_", "restart"))},
                             **health_summary(fleet, rec)},
        "peak_rss_mb": {f"replica{i}": peak_rss_mb(pid) for i, pid in enumerate(fleet.pids)},
        "client_peak_rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
    }


# -- running it ---------------------------------------------------------------------------------------
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
    parser.add_argument("--workloads", nargs="+", default=["uploads", "restart"], choices=sorted(WORKLOADS))
    parser.add_argument("--out", type=Path, default=OUT / "load_bench.json")
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
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faultline-load-")))
        env = {"FAULTLINE_DATABASE_URL": url, "FAULTLINE_ADMIN_TOKEN": ADMIN_TOKEN,
               "FAULTLINE_DB_CONNECT_TIMEOUT_S": "2"}
        replicas, pids = [], []
        for i in range(args.replicas):
            replica = stack.enter_context(serve_process(
                {**env, "FAULTLINE_DATA_DIR": str(folder / f"replica{i}")}, workers=args.workers,
                log_path=folder / f"replica{i}.log"))
            replicas.append(replica.url)
            pids.append(replica.pid)
        expected = quiet_reasons(replicas[0], logs)
        fleet = Fleet(cluster, url, replicas, pids)
        rec = Recorder()
        began = time.monotonic()
        asyncio.run(run_workloads(fleet, rec, args, logs))
        wall = time.monotonic() - began
        result = report(fleet, rec, args, logs, expected, wall)
        tracebacks = sum((folder / f"replica{i}.log").read_text(errors="replace").count("Traceback")
                         for i in range(args.replicas))
        result["server_tracebacks"] = tracebacks
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    ok = result["errors"] == 0 and result["store"]["lost"] == 0 and result["wrong_reason_under_load"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
