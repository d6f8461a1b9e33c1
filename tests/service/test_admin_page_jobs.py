"""The /admin page's job list and job review on a real server (SQLite, or PostgreSQL in the
PostgreSQL run): validation results read as stored, the job list's action and suspect-node
columns and its search (bound, escaped, bounded), and the form that confirms or corrects a
job's diagnosis through the same model and function as POST /admin/jobs/{id}/confirm."""

from __future__ import annotations

import re

import httpx
import pytest

from fixtures.logs.unknown_formats import helix_log
from service.admin.web import MAX_SEARCH_CHARS, check
from service.settings import Settings
from tests.support.server import running_server

TOKEN = "jobs-4f7a1c9e2b6d0835"
CAROL = "carol-1b8e5d3a7c9f2064"
ECC_JOB = "helix-13b-pretrain-20250212-9f3e21"
KEY_JOB = "gpt-7b-20250331-ab12cd"
LIVE_JOB = "llama3-70b-live"
SLURM_ID = "slurm-494583_7"
ITERATION = ("[default0]: [2025-03-31 05:54:07] iteration {step:>8}/  242204 | "
             "consumed samples:        50400 | elapsed time per iteration (ms): 1552.8 | "
             "learning rate: 8.000000E-06 | global batch size:  1008 | lm loss: {loss:.6E} | "
             "loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | "
             "number of nan iterations:   0 |")
MEGATRON = "\n".join(ITERATION.format(step=s, loss=6.0 - s * 0.01) for s in range(10, 410, 10)) + \
    "\n[default3]:KeyError: 'dataset_index'\n"


AT = r' <span class="muted small">\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)</span>'
"""When the job's diagnosis was confirmed, as its review section shows it."""


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)


def job_names(page: str) -> set[str]:
    return set(re.findall(r'<a href="/admin/job/[0-9a-f]+">([^<]+)</a>', page))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Three jobs: a helix run that died of an ECC error on node trn-b05, a Megatron run
    that died of a KeyError, and a live job of a Slurm id that has said nothing yet."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("jobs-data"), admin_token=TOKEN,
                        admin_tokens=f"carol:{CAROL}")
    helix = helix_log(steps=3000, nodes=1, ranks_per_node=8, seed=62, failure="ecc").text()
    with running_server(settings) as url:
        for params, body in (({"job_name": ECC_JOB}, helix),
                             ({"job_name": KEY_JOB, "framework": "megatron"}, MEGATRON)):
            r = httpx.post(f"{url}/diagnose", content=body, params=params, timeout=120)
            assert r.status_code == 200, r.text
        r = httpx.post(f"{url}/jobs", json={"name": LIVE_JOB, "external_id": SLURM_ID}, timeout=30)
        assert r.status_code == 201, r.text
        yield url


@pytest.fixture
def browser(site):
    """A signed-in client (as carol) that keeps its cookie, like a browser."""
    with httpx.Client(base_url=site, follow_redirects=False, timeout=120) as client:
        r = client.post("/admin/login", data={"token": CAROL})
        assert r.status_code == 303
        yield client


def api(site: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{site}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                         **kwargs)


def audit_of(site: str, job_id: str, action: str = "") -> dict:
    return api(site, "GET", "/admin/audit", params={"target": job_id, "action": action}).json()


def job_id(site: str, name: str) -> str:
    (job,) = httpx.get(f"{site}/jobs", params={"name": name}, timeout=30).json()["data"]
    return job["id"]


@pytest.mark.parametrize(("stored", "shown"), [
    ("ok", (True, "")),
    ("ok: 122 confirmed lines", (True, "122 confirmed lines")),  # service.agents.failure
    ("ok:3 confirmed jobs", (True, "3 confirmed jobs")),
    ("failed: matches 2 lines of the error corpus", (False, "matches 2 lines of the error corpus")),
    ("failed", (False, "")),
    ("okay", (False, "okay")),
    ("ok-ish: maybe", (False, "ok-ish: maybe")),
    ("", (False, "")),
    (None, (False, "")),
])
def test_a_stored_validation_result_reads_as_it_is(stored, shown) -> None:
    assert check(stored) == shown


def test_the_job_list_shows_each_jobs_action_and_suspect_nodes(browser) -> None:
    page = browser.get("/admin").text.replace("<wbr>", "")  # break points in long action names
    assert "<th>action</th><th>suspect nodes</th>" in page
    rows = {name: row for row in page.split("<tr>") for name in job_names(row)}
    assert {ECC_JOB, KEY_JOB, LIVE_JOB} <= set(rows)
    assert "cordon_and_restart" in rows[ECC_JOB] and '<span class="mono">trn-b05</span>' in rows[ECC_JOB]
    assert "fix_and_resubmit" in rows[KEY_JOB] and "trn-b05" not in rows[KEY_JOB]


@pytest.mark.parametrize(("q", "found"), [
    ("trn-b05", {ECC_JOB}),            # a suspect node
    ("TRN-B0", {ECC_JOB}),             # any case, any part
    ("ecc_err", {ECC_JOB}),            # the reason
    ("gpt-7b", {KEY_JOB}),             # the name
    ("494583_7", {LIVE_JOB}),          # the external id
    ("  pretrain ", {ECC_JOB}),
    ("trn-b0_", set()),                # LIKE's wildcards are text
    ("%", set()),
    ("\\", set()),
    ("/", set()),
    ("' OR '1'='1' --", set()),        # bound, not spliced into SQL
    ("nowhere-zz", set()),
])
def test_the_search_finds_jobs_by_name_reason_node_or_external_id(browser, q, found) -> None:
    r = browser.get("/admin", params={"q": q})
    assert r.status_code == 200
    assert job_names(r.text) == found, q
    if not found:
        assert "No job matches" in r.text


def test_an_empty_search_lists_every_recent_job_and_a_long_one_is_cut(browser) -> None:
    assert {ECC_JOB, KEY_JOB, LIVE_JOB} <= job_names(browser.get("/admin", params={"q": "  "}).text)
    long = browser.get("/admin", params={"q": "trn-b05" + "x" * 10_000})
    assert long.status_code == 200 and job_names(long.text) == set()
    assert f"“trn-b05{'x' * (MAX_SEARCH_CHARS - 7)}”" in long.text


def test_the_form_corrects_a_diagnosis_like_the_json_route_and_the_page_says_who(site, browser) -> None:
    key_job = job_id(site, KEY_JOB)
    page = browser.get(f"/admin/job/{key_job}").text
    assert f'action="/admin/job/{key_job}/confirm"' in page
    assert '<option value="key_error" selected>' in page  # what the diagnosis said
    r = browser.post(f"/admin/job/{key_job}/confirm", data={
        "csrf": csrf_of(page), "reason": "dataloader_killed", "origin": "", "note": "OOM-killed"})
    assert r.status_code == 303 and r.headers["location"] == f"/admin/job/{key_job}?done=correct"
    shown = browser.get(r.headers["location"]).text
    assert "Corrected the diagnosis" in shown
    assert re.search(rf"Corrected by <strong>carol</strong>{AT}: <strong>dataloader_killed</strong>, origin "
                     r"user · note: OOM-killed</p>", shown)
    (entry,) = audit_of(site, key_job, "job.confirm")["data"]
    assert entry["actor"] == "carol"
    assert {k: entry["details"].get(k) for k in ("reason", "origin", "corrected", "note")} == {
        "reason": "dataloader_killed", "origin": "user", "corrected": True, "note": "OOM-killed"}

    # the JSON route writes what the page reads
    ecc_job = job_id(site, ECC_JOB)
    r = api(site, "POST", f"/admin/jobs/{ecc_job}/confirm", json={"note": "node pulled"})
    assert r.status_code == 200 and r.json()["incident"]["reason"] == "ecc_error"
    assert re.search(rf"Confirmed by <strong>admin</strong>{AT}: <strong>ecc_error</strong>, origin "
                     r"infrastructure · note: node pulled</p>", browser.get(f"/admin/job/{ecc_job}").text)


def test_confirming_as_right_keeps_the_diagnosis(site, browser) -> None:
    ecc_job = job_id(site, ECC_JOB)
    page = browser.get(f"/admin/job/{ecc_job}").text
    r = browser.post(f"/admin/job/{ecc_job}/confirm", data={"csrf": csrf_of(page), "note": ""})
    assert r.status_code == 303 and r.headers["location"] == f"/admin/job/{ecc_job}?done=confirm"
    shown = browser.get(r.headers["location"]).text
    assert "Confirmed the diagnosis" in shown
    assert re.search(rf"Confirmed by <strong>carol</strong>{AT}: <strong>ecc_error</strong>, origin "
                     r"infrastructure</p>", shown)


@pytest.mark.parametrize(("form", "status", "says"), [
    ({"reason": "not_a_reason"}, 422, "unknown reason"),
    ({"reason": "x" * 100}, 422, "reason: String should have at most 64 characters"),
    ({"reason": "ecc_error", "origin": "space"}, 422, "origin must be one of"),
    ({"note": "n" * 3000}, 422, "note: String should have at most 2000 characters"),
])
def test_a_wrong_correction_is_refused_on_the_page_and_nothing_is_stored(site, browser, form, status,
                                                                         says) -> None:
    key_job = job_id(site, KEY_JOB)
    before = audit_of(site, key_job)["total"]
    page = browser.get(f"/admin/job/{key_job}").text
    r = browser.post(f"/admin/job/{key_job}/confirm", data={"csrf": csrf_of(page), **form})
    assert r.status_code == status and says in r.text and 'role="alert"' in r.text
    assert audit_of(site, key_job)["total"] == before


def test_the_confirm_form_needs_a_session_a_fresh_token_and_this_site(site, browser) -> None:
    key_job = job_id(site, KEY_JOB)
    before = audit_of(site, key_job)["total"]
    with httpx.Client(base_url=site, follow_redirects=False, timeout=30) as anon:
        r = anon.post(f"/admin/job/{key_job}/confirm", data={"csrf": "0" * 64, "reason": "ecc_error"})
        assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    stale = browser.post(f"/admin/job/{key_job}/confirm", data={"csrf": "0" * 64, "reason": "ecc_error"})
    assert stale.status_code == 403
    csrf = csrf_of(browser.get(f"/admin/job/{key_job}").text)
    forged = browser.post(f"/admin/job/{key_job}/confirm", data={"csrf": csrf, "reason": "ecc_error"},
                          headers={"Origin": "http://attacker.example"})
    assert forged.status_code == 403
    assert audit_of(site, key_job)["total"] == before
    missing = browser.post("/admin/job/no-such-job/confirm", data={"csrf": csrf})
    assert missing.status_code == 404


def test_a_job_without_a_root_cause_has_no_review_form(site, browser) -> None:
    page = browser.get(f"/admin/job/{job_id(site, LIVE_JOB)}").text
    assert "/confirm" not in page and 'id="review"' not in page
