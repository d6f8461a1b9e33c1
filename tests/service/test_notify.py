"""Webhook notifications end to end: a real server posts to a loopback receiver that fails on
purpose; deliveries are retried with the same id, signed with HMAC-SHA256 over the body,
and carry the action and the nodes to cordon. Stalls reach the hook through the sweep."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from service.store.db import Database
from service.errors import ConfigError
from service.store.models import Job, Notification
from service.live.notify import Deliverer, event_for, sign, verify
from service.settings import Settings, load_settings
from tests.service.test_live_api import ECC, NCCL_TIMEOUT, NODE, iteration, text
from tests.service.test_live_api import Job as LiveJob
from tests.support.server import running_server
from tests.support.webhook import WebhookReceiver

SECRET = "whsec-8f3b2a61c4d94e7f"


def settings_for(tmp_path: Path, hook: WebhookReceiver, **overrides: object) -> Settings:
    return Settings(data_dir=tmp_path, admin_enabled=False, webhook_url=hook.url, webhook_secret=SECRET,
                    webhook_backoff_s=0.05, webhook_backoff_max_s=0.2, **overrides)


def test_the_signature_is_hmac_sha256_of_the_body() -> None:
    body = b'{"event":"failed"}'
    assert sign(b"key", body) == "sha256=" + __import__("hmac").new(b"key", body, "sha256").hexdigest()
    assert verify(b"key", body, sign(b"key", body))
    assert not verify(b"key", body + b" ", sign(b"key", body)) and not verify(b"key", body, None)


@pytest.mark.parametrize(("diagnosis", "event"), [
    ({"status": "failed", "root_cause": {"reason": "ecc_error"}}, "failed"),
    ({"status": "stalled", "root_cause": {"reason": "hang"}}, "stalled"),
    ({"status": "running", "root_cause": {"reason": "loss_spike"}}, "loss_spike"),
    ({"status": "running", "root_cause": None}, None),
    ({"status": "healthy", "root_cause": None}, None),
])
def test_which_diagnoses_call_for_a_notification(diagnosis: dict, event: str | None) -> None:
    assert event_for(diagnosis) == event


def test_a_webhook_without_a_secret_is_refused_at_startup() -> None:
    with pytest.raises(ConfigError, match="FAULTLINE_WEBHOOK_SECRET"):
        load_settings(webhook_url="http://127.0.0.1:9/hook")


def test_a_failure_is_notified_while_the_job_runs_retried_and_signed(tmp_path: Path) -> None:
    with WebhookReceiver(statuses=[500, 503]) as hook, running_server(settings_for(tmp_path, hook)) as url:
        job = LiveJob(url)
        job.send(f"{NODE}-rank7.log", text([iteration(s, 2.3) for s in range(1, 51)]))
        job.send(f"{NODE}-rank3.log", text([ECC]))
        seen = hook.wait_for(lambda ds: any(d.status == 200 for d in ds))
        assert [d.status for d in seen] == [500, 503, 200], "retried after each failure"
        assert len({d.headers["X-Faultline-Delivery"] for d in seen}) == 1, "one delivery, three attempts"
        for delivery in seen:
            assert verify(SECRET.encode(), delivery.body, delivery.headers["X-Faultline-Signature"])
            # what a receiver using a Standard Webhooks library checks (the library refuses a
            # timestamp more than five minutes off: a replay later on fails)
            standard = Webhook("whsec_" + base64.b64encode(SECRET.encode()).decode())
            assert standard.verify(delivery.body, dict(delivery.headers))["job"]["id"] == job.id
        assert len({d.headers["webhook-id"] for d in seen}) == 1, "a retry keeps its id: the receiver drops repeats"
        payload = seen[-1].json
        assert payload["event"] == "failed" and payload["final"] is False
        assert payload["job"]["id"] == job.id and payload["job"]["status"] == "failed"
        assert payload["reason"] == "ecc_error" and payload["action"] == "cordon_and_restart"
        assert payload["suspect_nodes"] == [NODE] and payload["root_cause"]["line"] == ECC
        # the timeouts that follow change nothing a scheduler acts on: no new notification
        for rank in (0, 1, 2):
            job.send(f"{NODE}-rank{rank}.log", text([NCCL_TIMEOUT.format(node=NODE, rank=rank)]))
        job.finish(1)
        seen = hook.wait_for(lambda ds: any(d.json.get("final") for d in ds if d.status == 200))
        finals = [d.json for d in seen if d.status == 200]
        assert [p["final"] for p in finals] == [False, True]
        assert finals[-1]["job"]["exit_code"] == 1 and finals[-1]["reason"] == "ecc_error"


def test_a_silent_job_is_reported_stalled_by_the_sweep(tmp_path: Path) -> None:
    with WebhookReceiver() as hook, running_server(settings_for(
            tmp_path, hook, hang_floor_s=1.0, hang_step_factor=1.0, hang_check_interval_s=0.2)) as url:
        job = LiveJob(url)
        job.send("rank7.log", text([iteration(s, 2.3, ms=50.0) for s in range(1, 101)]))
        # nobody asks about the job: the replica's sweep must find it
        seen = hook.wait_for(lambda ds: any(d.json["event"] == "stalled" for d in ds))
        payload = next(d.json for d in seen if d.json["event"] == "stalled")
        assert payload["reason"] == "hang" and payload["action"] == "restart"
        assert payload["stall"]["since"] == "progress" and payload["stall"]["silent_s"] > payload["stall"]["threshold_s"]
        assert payload["root_cause"]["line"] == iteration(100, 2.3, ms=50.0)
        view = job.get()
        assert view["status"] == "stalled" and view["diagnosis"]["root_cause"]["reason"] == "hang"


def test_a_loss_spike_is_notified_with_where_to_roll_back(tmp_path: Path) -> None:
    with WebhookReceiver() as hook, running_server(settings_for(tmp_path, hook)) as url:
        job = LiveJob(url)
        lines = [iteration(s, 2.2) for s in range(1, 151)]
        lines += [f"[{NODE}:7]:  successfully saved checkpoint from iteration     150 to /ckpt/gpt-7b [ t 1/1, p 1/1 ]"]
        lines += [iteration(s, float("nan")) for s in range(151, 153)]
        job.send("rank7.log", text(lines))
        payload = hook.wait_for(lambda ds: bool(ds))[0].json
        assert payload["event"] == "loss_spike" and payload["action"] == "rollback_and_skip"
        assert payload["rollback"]["checkpoint_step"] == 150 and payload["rollback"]["kind"] == "nan"


def test_delivery_gives_up_after_the_last_attempt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with WebhookReceiver(statuses=[500] * 10) as hook:
        settings = settings_for(tmp_path, hook, webhook_max_attempts=3)
        db = Database(settings.database_url)
        db.create_schema()
        with db.session() as session:
            session.add(Job(id="j1", name="gpt", live=True, meta={}))
            session.flush()
            session.add(Notification(job_id="j1", event="failed", payload={"event": "failed"}))
        deliverer = Deliverer(settings, db)

        async def rounds() -> None:
            async with httpx.AsyncClient(timeout=5) as client:
                deadline = time.monotonic() + 20
                while len(hook.deliveries) < 3 and time.monotonic() < deadline:
                    await deliverer.deliver_due(client)
                    await asyncio.sleep(0.05)

        with caplog.at_level(logging.INFO, logger="faultline.webhooks"):
            asyncio.run(rounds())
        with db.session() as session:
            row = session.get(Notification, 1)
            assert (row.status, row.attempts) == ("failed", 3) and row.last_error == "HTTP 500"
        db.close()
    # one line per attempt for the operator: which job, how it went, how long it took
    attempts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("webhook notification=1 ")]
    assert len(attempts) == 3 and all("job=j1 event=failed" in line and "seconds=" in line for line in attempts)
    assert "outcome=failed" in attempts[-1]


def test_a_chat_message_says_what_to_do_and_a_log_line_cannot_mention_anyone(tmp_path: Path) -> None:
    # a loopback stand-in for Slack's incoming webhook, beside the signed webhook
    line = f"{ECC} <!channel> <https://evil.example|click> & more"
    with WebhookReceiver(statuses=[500]) as chat, WebhookReceiver() as hook, running_server(Settings(
            data_dir=tmp_path, admin_enabled=False, webhook_url=hook.url, webhook_secret=SECRET,
            slack_webhook_url=chat.url, public_url="http://faultline.example:8080",
            webhook_backoff_s=0.05, webhook_backoff_max_s=0.2)) as url:
        job = LiveJob(url)
        job.send(f"{NODE}-rank7.log", text([iteration(s, 2.3) for s in range(1, 51)]))
        job.send(f"{NODE}-rank3.log", text([line]))
        seen = chat.wait_for(lambda ds: any(d.status == 200 for d in ds))
        signed = hook.wait_for(lambda ds: any(d.status == 200 for d in ds))
    assert [d.status for d in seen] == [500, 200], "retried on its own"
    assert [d.status for d in signed] == [200], "the signed webhook was sent once, not again with the chat's retry"
    assert "X-Faultline-Signature" not in seen[-1].headers
    message = seen[-1].json["text"]
    assert message.startswith("*gpt-") and " failed: `ecc_error` (infrastructure)" in message
    assert f"action: `cordon_and_restart` on {NODE}" in message
    assert "&lt;!channel&gt;" in message and "<!channel>" not in message and "&lt;https://evil.example|click&gt;" in message
    assert f"<http://faultline.example:8080/admin/job/{job.id}|job page>" in message
