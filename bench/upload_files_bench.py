"""Many files in one `POST /diagnose`: refused past the limit, linear in the files up to it.

    python -m bench.upload_files_bench [--files 1000,5000,10000]

A real `faultline serve` (one worker, a fresh SQLite store, the embedded defaults) gets one
multipart upload per count: that many rank files of 20 lines each (Megatron-LM iteration
lines, the last file ending in a CUDA OOM), then one file more than the limit
(service/ingest/upload.py MAX_FILES). Reported per count: HTTP status, seconds, seconds per
1,000 files (flat when the cost is linear), the root cause named, and the server's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.load_bench import peak_rss_mb
from service.ingest.upload import MAX_FILES
from tests.support.processes import serve_process

OOM = "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {g} has a total capacity of 79.15 GiB"


def rank_file(rank: int, failing: bool) -> bytes:
    lines = [f" iteration {n:8d}/  500000 | consumed samples: {n * 128:12d} | elapsed time per iteration (ms): 1234.5 | "
             f"learning rate: 1.500E-04 | global batch size:   128 | lm loss: 2.345678E+00 | loss scale: 65536.0 |"
             for n in range(1, 21)]
    if failing:
        lines.append(OOM.format(r=rank, g=rank % 8))
    return ("\n".join(lines) + "\n").encode()


def upload(url: str, count: int) -> dict:
    files = [("file", (f"logs/rank{r}.log", rank_file(r, r == count - 1), "text/plain")) for r in range(count)]
    started = time.perf_counter()
    r = httpx.post(f"{url}/diagnose", files=files, params={"job_name": f"files-{count}"}, timeout=600)
    seconds = time.perf_counter() - started
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    root = body.get("root_cause") or {}
    return {"files": count, "status": r.status_code, "seconds": round(seconds, 2),
            "per_1000_files_s": round(seconds / count * 1000, 2), "reason": root.get("reason"),
            "error": body.get("error")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="1000,5000,10000", help="counts to upload, comma-separated")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.files.split(",")] + [MAX_FILES + 1]
    with tempfile.TemporaryDirectory(prefix="faultline-files-") as tmp:
        env = {"FAULTLINE_DATA_DIR": str(Path(tmp)), "FAULTLINE_ADMIN_ENABLED": "false"}
        with serve_process(env) as replica:
            for count in counts:
                row = upload(replica.url, count)
                row["server_peak_rss_mb"] = round(peak_rss_mb(replica.pid), 1)
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
