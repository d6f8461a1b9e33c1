"""GET /metrics on a real server: what POST /diagnose and the admin API count, the latency
histogram by route template, bounded labels, and one registry per app."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fixtures.logs.unknown_formats import helix_log
from service.app import create_app
from service.settings import Settings
from tests.support.server import running_server

TOKEN = "met-7d1a9c3e5f0b2486"
LABELS = {"entry", "status", "reason", "origin", "source", "agent", "backend", "outcome", "kind", "check",
          "action", "method", "route", "le"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> dict:
    data = tmp_path_factory.mktemp("metrics-data")
    with running_server(Settings(data_dir=data, admin_token=TOKEN)) as url:
        log = helix_log(steps=3000, nodes=1, ranks_per_node=8, seed=41, failure="keyerror")
        diagnosis = httpx.post(f"{url}/diagnose", content=log.text(), timeout=120).json()
        job = httpx.get(f"{url}/jobs/{diagnosis['job_id']}", timeout=10)
        assert job.status_code == 200
        assert httpx.get(f"{url}/no/such/path", timeout=10).status_code == 404
        for method in ("BREW", "X-MADE-UP-1", "X-MADE-UP-2"):  # each must not become a series
            httpx.request(method, f"{url}/healthz", timeout=10)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        pending = httpx.get(f"{url}/admin/rules", params={"status": "pending"}, headers=headers, timeout=10).json()
        rule_id = pending["data"][0]["id"]
        bad = httpx.patch(f"{url}/admin/rules/{rule_id}", json={"pattern": ".*"}, headers=headers, timeout=30)
        assert bad.status_code == 422
        assert httpx.post(f"{url}/admin/rules/{rule_id}/approve", headers=headers, timeout=10).status_code == 200
        r = httpx.get(f"{url}/metrics", timeout=10)
        assert r.status_code == 200
        return {"text": r.text, "content_type": r.headers["content-type"], "diagnosis": diagnosis,
                "pending": pending["total"]}


def test_diagnose_is_counted(scraped) -> None:
    text, d = scraped["text"], scraped["diagnosis"]
    comp = d["compression"]
    assert value(text, "faultline_lines_ingested_total", entry="diagnose") == comp["lines_in"]
    assert value(text, "faultline_lines_filtered_total", entry="diagnose") == comp["lines_in"] - comp["lines_kept"]
    assert value(text, "faultline_bytes_ingested_total", entry="diagnose") == comp["bytes_in"]
    assert value(text, "faultline_diagnoses_total", status="failed", reason="key_error", origin="user",
                 source="rule") == 1


def test_agent_calls_votes_and_validation_rejections_are_counted(scraped) -> None:
    text = scraped["text"]
    calls = value(text, "faultline_agent_calls_total", agent="log_agent", backend="embedded")
    assert calls >= 1
    assert value(text, "faultline_agent_votes_total", agent="log_agent", outcome="cast") == 5 * calls
    assert value(text, "faultline_rules_accepted_total", agent="log_agent", kind="filter") >= scraped["pending"]
    assert value(text, "faultline_validation_rejections_total", origin="admin_edit", check="no_error_lines") == 1
    assert value(text, "faultline_admin_actions_total", action="approve") == 1
    assert value(text, "faultline_rules", kind="filter", status="active") == 1
    assert value(text, "faultline_rules", kind="filter", status="pending") == scraped["pending"] - 1


def test_latency_histogram_by_route_template(scraped) -> None:
    text = scraped["text"]
    assert value(text, "faultline_http_request_duration_seconds_count", method="POST", route="/diagnose",
                 status="200") == 1
    assert value(text, "faultline_http_request_duration_seconds_count", method="GET", route="/jobs/{job_id}",
                 status="200") == 1
    assert value(text, "faultline_http_request_duration_seconds_count", method="PATCH",
                 route="/admin/rules/{rule_id}", status="422") == 1
    assert value(text, "faultline_http_request_duration_seconds_count", method="GET", route="unmatched",
                 status="404") == 1
    assert value(text, "faultline_http_request_duration_seconds_bucket", method="POST", route="/diagnose",
                 status="200", le="+Inf") == 1
    assert value(text, "faultline_http_request_duration_seconds_count", method="other", route="/healthz",
                 status="405") == 3
    assert "BREW" not in text and "MADE-UP" not in text


def test_counters_end_in_total_and_labels_hold_no_ids(scraped) -> None:
    text, d = scraped["text"], scraped["diagnosis"]
    assert scraped["content_type"].startswith("text/plain")
    counters = re.findall(r"^# TYPE (\S+) counter$", text, re.M)
    assert len(counters) >= 8
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if any(name.startswith(c) for c in counters):
                assert name.endswith("_total"), name
    assert d["job_id"] not in text
    label_names = {k for _, labels in samples(text) for k, _ in labels}
    assert label_names <= LABELS
    for _, labels in samples(text):
        for _, v in labels:
            assert not re.search(r"[0-9a-f]{12}", v), v  # no job, rule or run ids
            assert not v.startswith("la-") and "rank" not in v


def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    one = create_app(Settings(data_dir=tmp_path / "1", admin_token=TOKEN))
    two = create_app(Settings(data_dir=tmp_path / "2", admin_token=TOKEN))
    assert one.state.metrics.registry is not two.state.metrics.registry
    assert prometheus_client.REGISTRY not in (one.state.metrics.registry, two.state.metrics.registry)
    one.state.metrics.admin_action("approve")
    assert 'action="approve"' in one.state.metrics.render().decode()
    assert 'action="approve"' not in two.state.metrics.render().decode()
    assert not any(name.startswith("faultline_") for name in prometheus_client.REGISTRY._names_to_collectors)


def test_label_values_stay_in_fixed_sets_whatever_a_diagnosis_says(tmp_path: Path) -> None:
    """A diagnosis from an agent might name a reason or origin outside the taxonomy: it is
    counted as `other`, never as a new label value."""
    metrics = create_app(Settings(data_dir=tmp_path, admin_token=TOKEN)).state.metrics
    for reason, origin in (("gpu_gremlins_in_rack_7", "cosmic rays"), ("ecc_error", "infrastructure"), (None, None)):
        metrics.observe_diagnosis({"status": "failed", "root_cause": {"reason": reason, "origin": origin,
                                                                     "source": "failure_agent"},
                                   "compression": {"lines_in": 10, "lines_kept": 2}}, entry="diagnose")
    text = metrics.render().decode()
    assert value(text, "faultline_diagnoses_total", status="failed", reason="other", origin="other",
                 source="failure_agent") == 1
    assert value(text, "faultline_diagnoses_total", status="failed", reason="ecc_error", origin="infrastructure",
                 source="failure_agent") == 1
    assert value(text, "faultline_diagnoses_total", status="failed", reason="none", origin="none",
                 source="failure_agent") == 1
    assert "gremlins" not in text and "cosmic" not in text


def test_failure_agent_reports_count_llm_answers_fallbacks_and_write_backs() -> None:
    from service.metrics import Metrics

    metrics = Metrics()
    # two LLM answers failed the checks, the third was used; its rule was refused by history
    metrics.failure_agent_report({"llm_attempts": 3, "llm_problems": ["not a line of this log", "bad json"],
                                  "decision": {"source": "failure_agent"}, "write_back": {"status": "refused"}})
    # the model never answered usefully: the embedded decision stood, and its rule waits for review
    metrics.failure_agent_report({"llm_attempts": 3, "llm_problems": ["a", "b", "c"],
                                  "decision": {"source": "retrieval"}, "write_back": {"status": "pending"}})
    value = metrics.registry.get_sample_value
    assert value("faultline_agent_calls_total", {"agent": "failure_agent", "backend": "llm"}) == 6
    assert value("faultline_agent_calls_total", {"agent": "failure_agent", "backend": "embedded"}) == 1
    assert value("faultline_agent_votes_total", {"agent": "failure_agent", "outcome": "failed"}) == 5
    assert value("faultline_agent_votes_total", {"agent": "failure_agent", "outcome": "cast"}) == 1
    assert value("faultline_rules_accepted_total", {"agent": "failure_agent", "kind": "diagnosis"}) == 1
    assert value("faultline_validation_rejections_total", {"origin": "failure_agent", "check": "write_back"}) == 1


def test_failed_votes_of_an_llm_the_miner_stood_in_for_count_as_failed() -> None:
    from service.metrics import Metrics

    metrics = Metrics()
    metrics.log_agent_report({"kind": "embedded", "ballots": 5, "failed_ballots": 0, "accepted": ["la-1"],
                              "rejected": [], "discarded_ballots": 5, "discarded_failures": {"malformed": 5}})
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert value(text, "faultline_agent_votes_total", agent="log_agent", outcome="cast") == 5
    assert value(text, "faultline_agent_votes_total", agent="log_agent", outcome="failed") == 5


def test_a_two_worker_server_sums_its_workers_and_counters_never_go_back(tmp_path: Path) -> None:
    """`serve --workers 2`: scrapes land on either worker, and each must report what both
    counted (with a registry per process, a counter read 1, 1, 5, 1, ... and Prometheus saw
    resets). Uploads and scrapes alternate, 30 scrapes in all."""
    from tests.support.processes import serve_process

    log = "\n".join(f"step {i} loss 2.{i:02d}" for i in range(50)) + "\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    env = {"FAULTLINE_DATA_DIR": str(tmp_path), "FAULTLINE_ADMIN_ENABLED": "false"}
    seen: list[tuple[float, float, float]] = []
    with serve_process(env, workers=2) as server:
        posted = 0
        for round_ in range(30):
            if round_ % 2 == 0:
                r = httpx.post(f"{server.url}/diagnose", content=log, timeout=60)
                assert r.status_code == 200, r.text
                posted += 1
            text = httpx.get(f"{server.url}/metrics", timeout=30).text
            counted = samples(text)
            diagnoses = sum(v for (name, _), v in counted.items() if name == "faultline_diagnoses_total")
            lines = sum(v for (name, _), v in counted.items() if name == "faultline_lines_ingested_total")
            requests = sum(v for (name, _), v in counted.items()
                           if name == "faultline_http_request_duration_seconds_count")
            seen.append((diagnoses, lines, requests))
            assert diagnoses == posted, (round_, diagnoses, posted)
    for before, after in zip(seen, seen[1:]):
        assert all(b <= a for b, a in zip(before, after, strict=True)), seen
    assert seen[-1][1] == 15 * 51  # every line of every upload, whichever worker took it
    assert seen[-1][2] >= 45  # the requests of both workers (the scrape itself is counted after it answers)
    assert "process_cpu_seconds_total" not in text  # one process's figures would jump between scrapes


def test_one_process_exposes_its_process_metrics(scraped) -> None:
    assert value(scraped["text"], "process_cpu_seconds_total") > 0
