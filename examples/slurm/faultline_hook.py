#!/usr/bin/env python3
"""A Faultline webhook receiver for Slurm: drain the nodes a failure names, requeue the job.

    FAULTLINE_WEBHOOK_SECRET=... ./faultline_hook.py --port 9090            # prints what it would do
    FAULTLINE_WEBHOOK_SECRET=... ./faultline_hook.py --port 9090 --apply    # runs scontrol

Point the service at it with FAULTLINE_WEBHOOK_URL=http://<this host>:9090/ and the same
FAULTLINE_WEBHOOK_SECRET. Only the standard library; run it where `scontrol` works as an
operator (SlurmUser or root).

What it does with a notification (see the service's service/live/notify.py for the payload):
- `cordon_and_restart` (a hardware or node rule's line backs it: ECC, Xid, NVLink, a lost
  node; a CUDA error alone is never one): once the job has ended (`final`), drain each suspect
  node with the reason, at most --max-drains-per-hour nodes in any hour, then requeue the job,
  which Slurm restarts on healthy nodes from its last checkpoint. While the job still runs,
  its diagnosis may change with the next lines, and draining under a running job takes effect
  only when it ends anyway: the hook waits for the final diagnosis and says so.
- `restart` (a hang, a transient network or storage error): requeue the job while it still
  runs (its ranks would otherwise wait in a collective until the NCCL timeout).
- `rollback_and_skip` (a loss spike): nothing automatic; the message says which checkpoint
  to go back to and which steps to skip.
Whatever it does not do (a drain over the limit, a node name that is not a plain host name,
a drain of a running job), it prints as `skipped: ...` with the reason.
Each delivery is checked the Standard Webhooks way (the service signs `webhook-id`,
`webhook-timestamp` and the body): a bad signature, or one sent more than five minutes ago (a
captured delivery replayed), gets 401; a repeat of a `webhook-id` already handled (a retry whose
answer was lost) is acknowledged and ignored.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLURM_KEY = re.compile(r"^slurm-(\d+(?:_\d+)?)$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""Node names from a log are untrusted text: only plain host names reach scontrol."""


TOLERANCE_S = 300


def verify(secret: bytes, body: bytes, headers) -> str | None:
    """The delivery's id when its Standard Webhooks signature is right and recent, else None."""
    message_id, stamp, signatures = (headers.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (message_id and stamp and signatures and stamp.isdigit()):
        return None
    if abs(time.time() - int(stamp)) > TOLERANCE_S:
        return None
    digest = hmac.new(secret, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(digest).decode()
    return message_id if any(hmac.compare_digest(expected, s) for s in signatures.split()) else None


HOUR_S = 3600.0
MAX_DRAINS_PER_HOUR = 2
"""A fault that drains more nodes than this in an hour is the fabric, the storage or a bad
image, not the nodes: draining on would empty the partition."""


class DrainBudget:
    """Nodes drained in the last hour (by this hook), so that one bad diagnosis, or one per
    job of a failing rack, cannot drain the cluster."""

    def __init__(self, per_hour: int = MAX_DRAINS_PER_HOUR, clock=time.monotonic):
        self.per_hour, self.clock = per_hour, clock
        self.drained: dict[str, float] = {}

    def take(self, node: str) -> str | None:
        """None when `node` may be drained now (and counts it), else why not."""
        now = self.clock()
        self.drained = {n: t for n, t in self.drained.items() if now - t < HOUR_S}
        if node in self.drained:
            return f"{node} was drained by this hook {now - self.drained[node]:.0f} s ago"
        if len(self.drained) >= self.per_hour:
            return f"{len(self.drained)} nodes drained in the last hour (--max-drains-per-hour {self.per_hour})"
        self.drained[node] = now
        return None


def commands(payload: dict, budget: DrainBudget) -> tuple[list[list[str]], list[str]]:
    """The scontrol commands a notification calls for (none if it names no Slurm job), and
    what was skipped, with why."""
    match = SLURM_KEY.match(str((payload.get("job") or {}).get("external_id") or ""))
    action = payload.get("action")
    if match is None or payload.get("event") not in ("failed", "stalled"):
        return [], []
    job_id = match.group(1)
    reason = f"faultline: {payload.get('reason') or 'unknown'} (job {job_id})"
    out: list[list[str]] = []
    skipped: list[str] = []
    nodes = payload.get("suspect_nodes") or []
    if action == "cordon_and_restart" and not payload.get("final"):
        skipped.append(f"drain of {', '.join(nodes) or 'no node'} and requeue of job {job_id}: the job is still "
                       "running; waiting for its final diagnosis")
        return out, skipped
    if action == "cordon_and_restart":
        for node in nodes:
            if not NODE_NAME.match(node):
                skipped.append(f"drain of {node!r}: not a plain host name")
            elif (why := budget.take(node)) is not None:
                skipped.append(f"drain of {node}: {why}")
            else:
                out.append(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    if action == "cordon_and_restart" or (action == "restart" and not payload.get("final")):
        # a restart is acted on while the job runs, once: the job it requeues ends, and its
        # final diagnosis says the same
        out.append(["scontrol", "requeue", job_id])
    return out, skipped


class Hook(BaseHTTPRequestHandler):
    secret = b""
    apply = False
    seen: set[str] = set()
    budget = DrainBudget()

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        delivery = verify(self.secret, body, self.headers)
        if delivery is None:
            self._reply(401)
            return
        if delivery in self.seen:
            self._reply(200)  # a repeat (our answer was lost): already handled
            return
        payload = json.loads(body)
        todo, skipped = commands(payload, self.budget)
        for command in todo:
            if self.apply:
                subprocess.run(command, check=False, timeout=30)
            else:
                print("would run:", " ".join(command), flush=True)
        for why in skipped:
            print("skipped:", why, flush=True)
        if payload.get("action") == "rollback_and_skip":
            print(f"job {payload['job']['name']}: {payload.get('mitigation')}", flush=True)
        self.seen.add(delivery)
        self._reply(200)

    def _reply(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description="Faultline webhook receiver for Slurm")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--apply", action="store_true", help="run scontrol (default: print what it would run)")
    parser.add_argument("--max-drains-per-hour", type=int, default=MAX_DRAINS_PER_HOUR, metavar="N",
                        help=f"drain at most N nodes in any hour; more are skipped, saying why (default {MAX_DRAINS_PER_HOUR})")
    args = parser.parse_args()
    secret = os.environ.get("FAULTLINE_WEBHOOK_SECRET", "")
    if not secret:
        sys.stderr.write("faultline_hook: set FAULTLINE_WEBHOOK_SECRET (the service's webhook secret)\n")
        return 2
    if args.max_drains_per_hour < 0:
        parser.error("--max-drains-per-hour must be 0 or more")
    Hook.secret, Hook.apply, Hook.budget = secret.encode(), args.apply, DrainBudget(args.max_drains_per_hour)
    server = ThreadingHTTPServer((args.host, args.port), Hook)
    print(f"listening on {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
