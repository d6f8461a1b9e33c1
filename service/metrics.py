"""Prometheus metrics (prometheus-client), one registry per app, never the global one.

Labels take values from small fixed sets (taxonomy reasons, origins, statuses, route
templates, check names): never a job id, a rank, a rule id or a raw path, so the number of
series stays bounded whatever the traffic. Counters are declared without the `_total`
suffix; prometheus-client adds it to the exposed sample names.

With `faultline serve --workers N`, the workers count into prometheus-client's multiprocess
files (PROMETHEUS_MULTIPROC_DIR, which `serve` sets up) and any worker's /metrics sums them
all: a counter never goes back when the next scrape lands on another worker. The process_*
metrics describe one process, so they are exposed only with one worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rules.taxonomy import JobStatus, Origin, is_reason

disable_created_metrics()  # no `_created` series: they double the output and say little here

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Any other method a client makes up counts as `other`, or each would be a new series."""


def _one_of(value: str | None, known: Any) -> str:
    """value when it is one of the known ones, `none` when absent, else `other`: label values
    come from a fixed set even if a diagnosis (an agent's, say) holds something unexpected."""
    if not value:
        return "none"
    return value if value in known else "other"


STATUSES = frozenset(s.value for s in JobStatus)
ORIGINS = frozenset(o.value for o in Origin)


def _reason(reason: str | None) -> str:
    if isinstance(reason, str) and is_reason(reason):
        return reason
    return _one_of(reason, ())


def _source_kind(source: str | None) -> str:
    """`rule:<id>` -> `rule`: the kind of what named the root cause, not the rule itself."""
    if not source:
        return "none"
    return source.split(":", 1)[0][:32]


MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's own switch: set, every metric of the process counts into a file there."""


def multiprocess_mode() -> bool:
    return bool(os.environ.get(MULTIPROCESS_DIR))


class _RuleCounts(Collector):
    """Stored rules by kind and status, as read from the database at the last scrape: a value
    of the store, not of a process, so it is never summed over workers."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("faultline_rules", "Stored rules (learned, suggested, imported) by kind and "
                                   "status.", labels=["kind", "status"])
        for kind, by_status in sorted(self.counts.items()):
            for status, n in sorted(by_status.items()):
                family.add_metric([kind, status], n)
        yield family


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess_mode()
        self._rules = _RuleCounts()
        if not self.multiprocess:
            r.register(self._rules)
            ProcessCollector(registry=r)
        self.lines_ingested = Counter("faultline_lines_ingested", "Log lines read, by entry point.",
                                      ["entry"], registry=r)
        self.lines_filtered = Counter("faultline_lines_filtered", "Log lines dropped by filter rules.",
                                      ["entry"], registry=r)
        self.bytes_ingested = Counter("faultline_bytes_ingested", "Log bytes read (before decompression).",
                                      ["entry"], registry=r)
        self.diagnoses = Counter("faultline_diagnoses", "Diagnoses made, by job status, root-cause reason, "
                                 "origin and what named it (rule, failure_agent, retrieval, progress, ...).",
                                 ["status", "reason", "origin", "source"], registry=r)
        self.agent_calls = Counter("faultline_agent_calls", "Calls to an agent's backend (one per segment for "
                                   "the Log Agent), by agent and backend kind.", ["agent", "backend"], registry=r)
        self.votes = Counter("faultline_agent_votes", "Ballots cast by self-consistency voting; outcome is "
                             "cast or failed (no usable reply).", ["agent", "outcome"], registry=r)
        self.rules_accepted = Counter("faultline_rules_accepted", "Rules an agent proposed that won the vote "
                                      "and passed validation.", ["agent", "kind"], registry=r)
        self.validation_rejections = Counter("faultline_validation_rejections", "Rules refused by validation, "
                                             "by who proposed them and the first check that failed.",
                                             ["origin", "check"], registry=r)
        self.admin_actions = Counter("faultline_admin_actions", "Admin actions on rules.", ["action"], registry=r)
        self.request_latency = Histogram("faultline_http_request_duration_seconds", "HTTP request latency, by "
                                         "method, route template and status code.", ["method", "route", "status"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.live_chunks = Counter("faultline_live_chunks", "Chunks sent to live jobs, by outcome (new, duplicate, "
                                   "gap, overlap, raced).", ["outcome"], registry=r)
        self.notifications = Counter("faultline_notifications", "Webhook deliveries, by event and outcome "
                                     "(delivered, retry, failed).", ["event", "outcome"], registry=r)
        self.stalls = Counter("faultline_stalls_detected", "Live jobs marked stalled, by what fell silent "
                              "(progress, output).", ["since"], registry=r)

    # -- observations ----------------------------------------------------------------------------
    def observe_diagnosis(self, diagnosis: dict[str, Any], *, entry: str) -> None:
        compression = diagnosis.get("compression") or {}
        lines_in = int(compression.get("lines_in") or 0)
        kept = int(compression.get("lines_kept") or 0)
        self.lines_ingested.labels(entry).inc(lines_in)
        self.lines_filtered.labels(entry).inc(max(0, lines_in - kept))
        self.bytes_ingested.labels(entry).inc(int(compression.get("bytes_in") or 0))
        root = diagnosis.get("root_cause") or {}
        self.diagnoses.labels(_one_of(diagnosis.get("status"), STATUSES), _reason(root.get("reason")),
                              _one_of(root.get("origin"), ORIGINS), _source_kind(root.get("source"))).inc()

    def log_agent_report(self, report: dict[str, Any]) -> None:
        """One segment the Log Agent worked on (agents.log_agent.JobLogAgent.reports)."""
        backend = str(report.get("kind") or "unknown")[:32]
        self.agent_calls.labels("log_agent", backend).inc()
        ballots, failed = int(report.get("ballots") or 0), int(report.get("failed_ballots") or 0)
        self.votes.labels("log_agent", "cast").inc(max(0, ballots - failed))
        # failed votes of an LLM the embedded miner stood in for count as failed too
        self.votes.labels("log_agent", "failed").inc(failed + int(report.get("discarded_ballots") or 0))
        self.rules_accepted.labels("log_agent", "filter").inc(len(report.get("accepted") or ()))
        for rejected in report.get("rejected") or ():
            failed_checks = rejected.get("failed") or ["unknown"]
            self.validation_rejections.labels("log_agent", failed_checks[0]).inc()

    def failure_agent_report(self, report: dict[str, Any]) -> None:
        """One job the Failure Agent worked on (agents.failure_agent.FailureAgent.reports)."""
        attempts = int(report.get("llm_attempts") or 0)
        decision = report.get("decision") or {}
        backend = "llm" if decision.get("source") == "failure_agent" else "embedded"
        if attempts:
            self.agent_calls.labels("failure_agent", "llm").inc(attempts)
            # an answer that failed the checks (not a real line, not a taxonomy id, ...) is a failed ballot
            failed = len(report.get("llm_problems") or ())
            self.votes.labels("failure_agent", "failed").inc(failed)
            self.votes.labels("failure_agent", "cast").inc(max(0, attempts - failed))
        if backend == "embedded":
            self.agent_calls.labels("failure_agent", "embedded").inc()
        written = report.get("write_back") or {}
        status = written.get("status")
        if status in ("pending", "active"):
            self.rules_accepted.labels("failure_agent", "diagnosis").inc()
        elif status == "refused":
            self.validation_rejections.labels("failure_agent", "write_back").inc()

    def validation_rejected(self, origin: str, failed: list[str]) -> None:
        self.validation_rejections.labels(origin, (failed or ["unknown"])[0]).inc()

    def admin_action(self, action: str) -> None:
        self.admin_actions.labels(action).inc()

    def set_rule_counts(self, counts: dict[str, dict[str, int]]) -> None:
        self._rules.counts = {kind: dict(by_status) for kind, by_status in counts.items()}

    def render(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        # every worker's files, read at each scrape (the library's documented way)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(self._rules)
        return generate_latest(registry)


class LatencyMiddleware:
    """Pure ASGI middleware: request latency by route template (never the raw path, which
    holds job and rule ids); requests that match no route count as `unmatched`."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.request_latency.labels(method if method in HTTP_METHODS else "other", template,
                                                str(status[0])).observe(
                time.perf_counter() - start)
