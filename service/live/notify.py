"""Webhook notifications: an outbox in the database, delivered with retries and a signature.

A job's change and its notification are written in one transaction, so a crash between the
two can neither lose nor invent a notification, and replicas never send one twice: each
delivery is claimed with a conditional update before it is sent. Failed deliveries are
retried with exponential backoff up to FAULTLINE_WEBHOOK_MAX_ATTEMPTS.

With FAULTLINE_SLACK_WEBHOOK_URL, each notification is also a chat message (service.live.slack),
a delivery of its own in the outbox (payload `"target": "slack"`), retried on its own.

Each delivery is signed the Standard Webhooks way (standardwebhooks.com): `webhook-id` (the
same on every retry of one notification, so a receiver drops a repeat whose answer was lost),
`webhook-timestamp` (when this attempt was sent: a receiver refuses one older than a few
minutes, so a captured delivery cannot be replayed later) and `webhook-signature: v1,<base64
HMAC-SHA256 of "id.timestamp.body">` keyed with FAULTLINE_WEBHOOK_SECRET's bytes (a Standard
Webhooks library verifies it with the secret "whsec_" + base64(secret)). The older
`X-Faultline-Signature: sha256=<hex>` (HMAC of the body alone, as GitHub signs) and
`X-Faultline-Delivery` are still sent for receivers written against them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from standardwebhooks import Webhook
from sqlalchemy.orm import Session

from rules.taxonomy import JobStatus
from service.live import slack
from service.store.db import Database
from service.metrics import Metrics
from service.store.models import Job, Notification, utcnow
from service.settings import Settings
from service.threads import in_thread

log = logging.getLogger("faultline.webhooks")

SIGNATURE_HEADER = "X-Faultline-Signature"
EVENT_HEADER = "X-Faultline-Event"
DELIVERY_HEADER = "X-Faultline-Delivery"
CLAIM_LEASE_S = 120.0
"""A claimed delivery another replica may retry if this one died while sending it."""
BATCH = 32


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """For receivers (and the examples): constant-time check of the signature header."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def standard_headers(secret: bytes, message_id: str, body: bytes, now: datetime | None = None) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt to deliver `body`."""
    when = now or datetime.now(UTC)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(secret).sign(message_id, when, body.decode())}


def message_id(nid: int) -> str:
    return f"faultline-{nid}"


def event_for(diagnosis: dict[str, Any] | None) -> str | None:
    """`failed`, `stalled` or `loss_spike` when a diagnosis calls for action, else None."""
    if not diagnosis:
        return None
    root = diagnosis.get("root_cause") or {}
    if diagnosis.get("status") == JobStatus.FAILED.value:
        return "failed"
    if diagnosis.get("status") == JobStatus.STALLED.value:
        return "stalled"
    if root.get("reason") == "loss_spike":
        return "loss_spike"
    return None


def event_key(diagnosis: dict[str, Any]) -> list[Any]:
    """What makes a notification new: the event, the reason and the nodes to cordon."""
    root = diagnosis.get("root_cause") or {}
    return [event_for(diagnosis), root.get("reason"), sorted(diagnosis.get("suspect_nodes") or [])]


def payload(job: Job, diagnosis: dict[str, Any], event: str, *, final: bool) -> dict[str, Any]:
    """What a scheduler hook needs to act: the action, the nodes, where to roll back to."""
    root = diagnosis.get("root_cause") or {}
    return {
        "event": event, "final": final,
        "job": {"id": job.id, "name": job.name, "external_id": job.external_id, "status": diagnosis.get("status"),
                "exit_code": job.exit_code, "lines_received": job.lines_received},
        "reason": root.get("reason"), "category": root.get("category"), "origin": root.get("origin"),
        "action": diagnosis.get("action"), "suspect_nodes": diagnosis.get("suspect_nodes") or [],
        "root_cause": diagnosis.get("root_cause"), "rollback": diagnosis.get("rollback"),
        "stall": diagnosis.get("stall"), "mitigation": diagnosis.get("mitigation") or "",
        "progress": diagnosis.get("progress") or {}, "diagnosed_at": utcnow().isoformat(),
    }


class Outbox:
    """Writes notifications in the caller's transaction; does nothing without a webhook URL
    (a null object, so callers have no `if webhook:` branches)."""

    def __init__(self, settings: Settings):
        self.targets = [target for target, url in (("webhook", settings.webhook_url),
                                                    ("slack", settings.slack_webhook_url.get_secret_value())) if url]
        self.enabled = bool(self.targets)
        self.wake = asyncio.Event()
        """Set after a commit that added notifications, so delivery does not wait for its tick."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def poke(self) -> None:
        """Wake the deliverer (callable from worker threads, after the commit)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.wake.set)

    def enqueue(self, session: Session, job: Job, diagnosis: dict[str, Any], *, final: bool = False) -> bool:
        event = event_for(diagnosis)
        if not self.enabled or event is None:
            return False
        body = payload(job, diagnosis, event, final=final)
        for target in self.targets:
            session.add(Notification(job_id=job.id, event=event, next_attempt_at=utcnow(),
                                     payload=body if target == "webhook" else {**body, "target": target}))
        return True


class Deliverer:
    """Sends due notifications; one runs in every replica, claims keep them from colliding."""

    def __init__(self, settings: Settings, db: Database, metrics: Metrics | None = None):
        self.settings = settings
        self.db = db
        self.metrics = metrics or Metrics()
        self.secret = settings.webhook_secret.get_secret_value().encode()

    def backoff_s(self, attempts: int) -> float:
        """Exponential with jitter, so replicas and receivers do not retry in lockstep."""
        base = min(self.settings.webhook_backoff_max_s, self.settings.webhook_backoff_s * 2 ** max(0, attempts - 1))
        return base * random.uniform(0.8, 1.2)

    def claim(self) -> list[tuple[int, int, str, dict[str, Any], str]]:
        """Due deliveries this replica now owns: (id, attempt, event, payload, job id)."""
        now = utcnow()
        claimed = []
        with self.db.session() as session:
            due = session.execute(select(Notification.id).where(Notification.status == "pending",
                                                                Notification.next_attempt_at <= now)
                                  .order_by(Notification.id).limit(BATCH)).scalars().all()
        for nid in due:
            with self.db.session() as session:
                won = session.execute(
                    update(Notification).where(Notification.id == nid, Notification.status == "pending",
                                               Notification.next_attempt_at <= now)
                    .values(attempts=Notification.attempts + 1,
                            next_attempt_at=now + timedelta(seconds=CLAIM_LEASE_S))).rowcount
                if won == 1:
                    row = session.get(Notification, nid)
                    claimed.append((nid, row.attempts, row.event, row.payload, row.job_id))
        return claimed

    def settle(self, nid: int, attempt: int, event: str, error: str | None, *, job_id: str | None = None,
               seconds: float | None = None) -> None:
        with self.db.session() as session:
            row = session.get(Notification, nid)
            if row is None:
                return
            if error is None:
                row.status, row.delivered_at, row.last_error = "delivered", utcnow(), ""
                outcome = "delivered"
            elif attempt >= self.settings.webhook_max_attempts:
                row.status, row.last_error = "failed", error[:2000]
                outcome = "failed"
                log.warning("webhook delivery %s (%s) failed for good after %d attempts", nid, event, attempt)
            else:
                row.next_attempt_at = utcnow() + timedelta(seconds=self.backoff_s(attempt))
                row.last_error = error[:2000]
                outcome = "retry"
        # one line per delivery attempt, key=value like the diagnosis line
        log.info("webhook notification=%s job=%s event=%s attempt=%d outcome=%s seconds=%s%s", nid, job_id or "-",
                 event, attempt, outcome, "-" if seconds is None else f"{seconds:.3f}",
                 "" if error is None else f" error={json.dumps(error[:200])}")
        self.metrics.notifications.labels(event, outcome).inc()

    async def send(self, client: httpx.AsyncClient, nid: int, event: str, body: dict[str, Any]) -> str | None:
        """None when the receiver accepted (2xx), else what went wrong."""
        if body.get("target") == "slack":
            url = self.settings.slack_webhook_url.get_secret_value()
            raw = json.dumps(slack.message(body, self.settings.public_url)).encode()
            headers = {"Content-Type": "application/json", "User-Agent": "faultline-webhook/1"}
        else:
            url = self.settings.webhook_url
            raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
            headers = {"Content-Type": "application/json", EVENT_HEADER: event, DELIVERY_HEADER: str(nid),
                       SIGNATURE_HEADER: sign(self.secret, raw), "User-Agent": "faultline-webhook/1",
                       **standard_headers(self.secret, message_id(nid), raw)}
        if not url:
            return "no URL configured for this target any more"
        try:
            response = await client.post(url, content=raw, headers=headers)
        except httpx.HTTPError as exc:
            # the Slack URL is its token: never in the stored error or the log line
            return f"{type(exc).__name__}: {exc}".replace(url, f"<{body.get('target', 'webhook')} URL>")
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}"

    async def deliver_due(self, client: httpx.AsyncClient) -> int:
        claimed = await in_thread(self.claim)
        for nid, attempt, event, body, job_id in claimed:
            began = time.monotonic()
            error = await self.send(client, nid, event, body)
            seconds = time.monotonic() - began
            await in_thread(lambda: self.settle(nid, attempt, event, error, job_id=job_id, seconds=seconds))
        return len(claimed)

    async def run(self, wake: asyncio.Event, *, tick_s: float = 1.0) -> None:
        """Deliver until cancelled: at each tick, and at once when woken."""
        async with httpx.AsyncClient(timeout=self.settings.webhook_timeout_s) as client:
            while True:
                try:
                    while await self.deliver_due(client) == BATCH:
                        pass
                except Exception:  # a database hiccup must not end delivery for good
                    log.exception("webhook delivery round failed")
                try:
                    await asyncio.wait_for(wake.wait(), timeout=tick_s)
                except TimeoutError:
                    pass
                wake.clear()
