"""The /admin page in a real headless Chromium (Debian's `chromium`, driven by Playwright),
against a real uvicorn server on loopback with a real SQLite database.

A person's path through the page: sign in with the token, see the rules the Log Agent
suggested for a log in a format no built-in pack knows, dry-run one, approve one by
clicking, and see the next diagnosis use it (in the JSON of POST /diagnose and on the new
job's page). Log text holding markup renders as text and runs nothing; a form posted from
another origin is refused; long log lines do not push the page sideways. A rule's checks
read as stored ("ok: 122 confirmed lines" is a pass that says so); the job list shows each
job's action and suspect nodes and finds jobs by a search; a job's diagnosis is corrected
by clicking, and the admin API's audit log and the job page both show the correction.

Screenshots of the dashboard, a rule page with its dry-run and a job page with its loss
curve are taken every run; with SCREENSHOTS_DIR set (`make screenshots`) they are kept
there (docs/screenshots/ in the repository).

Only when Debian's chromium is not installed (`make install` installs it as root) is the
module skipped, saying so.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from fixtures.logs.unknown_formats import helix_log
from service.settings import Settings
from service.store import jobs as store
from service.store.db import Database
from tests.support.server import free_port, running_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS_DIR = os.environ.get("SCREENSHOTS_DIR", "")
expect.set_options(timeout=30_000)  # a dry-run replays stored jobs; CI shares two cores

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"Debian's chromium is not installed at {CHROMIUM}: `apt-get install -y chromium` "
           "(`make install` does it when run as root)")

TOKEN = "brw-8c2e6a1f4d9b0357"
HOSTILE = "<script>alert('xss')</script><img src=x onerror=alert(1)>"
ITERATION = ("[default0]:[2025-03-31 05:{minute:02d}:07] iteration {step:>8}/  242204 | "
             "consumed samples: {samples:>12} | elapsed time per iteration (ms): 1552.8 | "
             "learning rate: 8.000000E-06 | global batch size:  1008 | lm loss: {loss:.6E} | loss scale: 1.0 | "
             "grad norm: 1.520 | number of skipped iterations:   0 | number of nan iterations:   0 |")
# a Megatron job that got to step 600 with a falling loss, then died on a KeyError whose key
# is markup: the page must show it as text
MEGATRON = "".join(ITERATION.format(minute=(s // 10) % 60, step=s, samples=s * 1008,
                                    loss=2.4 + 4.2 * 0.993 ** s + 0.03 * ((s * 7919) % 13) / 13) + "\n"
                   for s in range(10, 610, 10)) + (
    "[default3]:Traceback (most recent call last):\n"
    '[default3]:  File "/workspace/Megatron-LM/megatron/core/datasets/blended_dataset.py", line 105, '
    "in __getitem__\n"
    "[default3]:    dataset_id = self.dataset_index[idx]\n"
    f"[default3]:KeyError: '{HOSTILE}'\n")
MEGATRON_NAME = "gpt-7b-20250331-ab12cd"
# a job that could not fetch a data shard: its last error holds a presigned URL of 357
# characters with no space in it, which must wrap rather than widen the page
SHARD_URL = ("/llm-datasets/web-mix-v3/shards/cc-2024-18/part-000731-of-004096.jsonl.zst?"
             "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20250402T081532Z&X-Amz-Expires=3600"
             "&X-Amz-SignedHeaders=host&x-id=GetObject&response-content-disposition=attachment%3B%20filename"
             "%3Dpart-000731-of-004096.jsonl.zst&partNumber=1"
             "&versionId=3HL4kqtJvjVBH40Nrjfkd%2FuF6Jg0bR7Vq2Tn9wE1sLpXoMcYd")
# and, before that, a record that was not UTF-8, printed as Python shows bytes: 480
# characters with no place where a browser may break the line by itself
BAD_RECORD = "b'" + "".join(f"\\x{b:02x}" for b in bytes.fromhex("e4b880e4b8") * 24) + "'"
DATA_JOB = "".join(ITERATION.format(minute=s // 10, step=s, samples=s * 1008, loss=7.1 - s * 0.004) + "\n"
                   for s in range(10, 130, 10)) + "".join(f"[default5]:{line}\n" for line in (
    "WARNING:megatron.core.datasets.indexed_dataset:skipping a record of part-000731-of-004096.jsonl.zst "
    f"that is not UTF-8: {BAD_RECORD}",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.10/dist-packages/urllib3/connection.py", line 203, in _new_conn',
    "    sock = connection.create_connection(",
    "ConnectionRefusedError: [Errno 111] Connection refused",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.10/dist-packages/requests/adapters.py", line 667, in send',
    "    resp = conn.urlopen(",
    f"requests.exceptions.ConnectionError: HTTPSConnectionPool(host='objectstore.internal', port=443): Max retries "
    f"exceeded with url: {SHARD_URL} (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at "
    "0x7f3a2c1e9b50>: Failed to establish a new connection: [Errno 111] Connection refused'))"))
DATA_JOB_NAME = "llama3-8b-sft-20250402-77e1a0"
ECC_NAME = "helix-13b-pretrain-20250212-9f3e21"
ECC_NODE = "trn-b05"
"""The node the helix log's uncorrectable ECC error names."""


def helix(seed: int, failure: str | None = "keyerror") -> str:
    """A log in a format no built-in pack covers: the Log Agent learns its routine lines."""
    return helix_log(steps=3000, nodes=1, ranks_per_node=8, seed=seed, failure=failure).text()


def diagnose(site: str, text: str, **params: str) -> dict:
    r = httpx.post(f"{site}/diagnose", content=text, params=params, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def api(site: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{site}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                         **kwargs)


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("browser-data"), admin_token=TOKEN)


@pytest.fixture(scope="module")
def site(settings: Settings) -> Iterator[str]:
    """A server whose store holds a helix job (the Log Agent's pending rules), a second
    helix job that died of an ECC error, and the two Megatron jobs above."""
    with running_server(settings) as url:
        diagnose(url, helix(61))
        diagnose(url, helix(62, failure="ecc"), job_name=ECC_NAME)
        diagnose(url, DATA_JOB, job_name=DATA_JOB_NAME, framework="megatron")
        diagnose(url, MEGATRON, job_name=MEGATRON_NAME, framework="megatron")
        yield url


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser, site: str) -> Iterator[Page]:
    """A fresh browser context (no cookie), watched for dialogs and console errors: an
    alert() or a blocked inline script would mean log text was read as markup."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900}, base_url=site)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.dialogs, page.console_errors = [], []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: page.console_errors.append(m.text) if m.type == "error" else None)
    yield page
    context.close()


def sign_in(page: Page) -> None:
    page.goto("/admin")
    expect(page).to_have_url(re.compile(r"/admin/login$"))
    page.get_by_label("Admin token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/admin$"))
    expect(page.locator("header")).to_contain_text("signed in as admin")


def pending_ids(page: Page) -> list[str]:
    return [i.removeprefix("rule-") for i in page.locator("section.card[id^=rule-]").evaluate_all(
        "sections => sections.map(s => s.id)")]


def no_horizontal_overflow(page: Page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    """A full-page PNG; kept in SCREENSHOTS_DIR when that is set."""
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    width, height = png_size(path)
    assert width == 1280 and height >= 600, (name, width, height)
    if SCREENSHOTS_DIR:
        Path(SCREENSHOTS_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(SCREENSHOTS_DIR) / name)
    return path


@contextmanager
def other_site(html: str) -> Iterator[str]:
    """Another origin on loopback serving one page (a would-be attacker's)."""
    body = html.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- the tests ------------------------------------------------------------------------------------
def test_sign_in_then_the_dashboard_shows_pending_rules_with_their_evidence(page: Page, tmp_path: Path) -> None:
    page.goto("/admin/login")
    page.get_by_label("Admin token").fill(TOKEN + "x")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    page.console_errors.clear()  # the browser logs that 403
    sign_in(page)
    ids = pending_ids(page)
    assert len(ids) >= 3, ids
    first = page.locator(f"section[id='rule-{ids[0]}']")
    expect(first.get_by_role("heading", name="Evidence")).to_be_visible()
    expect(first.locator("pre.evidence")).to_contain_text("[helix ")  # lines of the log
    expect(first).to_contain_text("votes 5/5")
    expect(first.get_by_role("button", name="Approve")).to_be_visible()
    jobs = page.locator("table").first
    expect(jobs).to_contain_text(MEGATRON_NAME)
    expect(jobs.locator("svg.curve polyline")).to_have_count(4)  # every job here reported losses
    expect(jobs.locator("tr", has_text=DATA_JOB_NAME)).to_contain_text("Connection refused")
    assert no_horizontal_overflow(page)
    screenshot(page, tmp_path, "admin-dashboard.png")
    assert page.dialogs == [] and page.console_errors == []


def test_log_text_with_markup_is_shown_as_text_and_runs_nothing(page: Page, site: str) -> None:
    sign_in(page)
    row = page.locator("tr", has_text=MEGATRON_NAME)
    expect(row).to_contain_text(f"KeyError: '{HOSTILE}'")
    assert page.locator("main script, main img").count() == 0
    row.get_by_role("link", name=MEGATRON_NAME).click()
    expect(page.locator("h1")).to_contain_text(MEGATRON_NAME)
    expect(page.locator("table.kept")).to_contain_text(f"KeyError: '{HOSTILE}'")
    assert page.locator("main script, main img").count() == 0
    assert page.dialogs == [] and page.console_errors == []


def test_a_form_posted_from_another_origin_is_refused(page: Page, site: str) -> None:
    sign_in(page)
    rule_id = pending_ids(page)[-1]
    forged = (f'<form method="post" action="{site}/admin/rule/{rule_id}/approve">'
              f'<input type="hidden" name="csrf" value="{"0" * 64}"><input type="hidden" name="next" value="/admin">'
              '<button type="submit">Win a prize</button></form>')
    with other_site(forged) as attacker:
        page.goto(attacker)
        page.get_by_role("button", name="Win a prize").click()
        expect(page.locator("body")).to_contain_text("The form is stale or from another site")
    assert api(site, "GET", f"/admin/rules/{rule_id}").json()["status"] == "pending"


def test_dry_run_and_approve_by_clicking_then_the_next_diagnosis_uses_the_rule(page: Page, site: str,
                                                                                 tmp_path: Path) -> None:
    sign_in(page)
    rule_id = pending_ids(page)[0]
    page.locator(f"section[id='rule-{rule_id}']").get_by_role("link", name=rule_id).click()
    expect(page.locator("h1")).to_contain_text(rule_id)
    page.get_by_role("button", name="Replay the stored jobs").click()
    report = page.locator("#dry-run")
    expect(report).to_contain_text(re.compile(r"[1-9]\d* of \d+ stored jobs matched"))
    expect(report).to_contain_text("0 diagnoses would change")
    expect(report).to_be_in_viewport()  # the page opens at the result
    assert no_horizontal_overflow(page)
    screenshot(page, tmp_path, "admin-rule-dry-run.png")

    before = diagnose(site, helix(63))
    assert rule_id not in {f["rule"] for f in before["filtered"]}
    page.get_by_placeholder("note (optional)").fill("routine helix lines")
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status")).to_contain_text(f"Approved {rule_id}")
    expect(page.locator("h1 .badge")).to_have_text("active")

    after = diagnose(site, helix(63))
    dropped = {f["rule"]: f["count"] for f in after["filtered"]}
    assert dropped.get(rule_id, 0) > 0
    assert after["compression"]["lines_kept"] < before["compression"]["lines_kept"]
    assert after["root_cause"]["line"] == before["root_cause"]["line"]

    # the page shows it too: the new job's filtered lines name the rule, and the rule its hits
    page.goto("/admin")
    assert rule_id not in pending_ids(page)
    page.locator(f"a[href='/admin/job/{after['job_id']}']").click()
    filtered = page.locator("tr", has=page.locator("td", has_text=rule_id))
    expect(filtered).to_contain_text(f"{dropped[rule_id]:,}")
    page.goto(f"/admin/rule/{rule_id}")
    hits = int(re.search(r"hits (\d+)", page.locator(".card .row").first.inner_text()).group(1))
    assert hits >= dropped[rule_id]
    assert page.dialogs == [] and page.console_errors == []


def test_job_page_shows_the_loss_curve_and_long_lines_stay_inside(page: Page, tmp_path: Path) -> None:
    sign_in(page)
    page.get_by_role("link", name=MEGATRON_NAME).click()
    curve = page.locator("main svg.curve")
    expect(curve).to_be_visible()
    points = curve.locator("polyline").get_attribute("points").split()
    assert len(points) == 60
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[-1] > ys[0]  # the loss fell, and SVG's y grows downwards
    expect(curve.locator("text").first).to_have_text("6.331")  # the axis labels: highest loss on top
    expect(page.locator("main")).to_contain_text("at step 600")
    assert no_horizontal_overflow(page)
    screenshot(page, tmp_path, "admin-job.png")
    megatron_job = page.url

    page.goto("/admin")
    page.get_by_role("link", name=DATA_JOB_NAME).click()
    expect(page.locator("table.kept")).to_contain_text(SHARD_URL[-40:])
    expect(page.locator("table.kept")).to_contain_text(BAD_RECORD)
    data_job = page.url
    for width in (1280, 820):
        page.set_viewport_size({"width": width, "height": 900})
        for path in ("/admin", megatron_job, data_job):
            page.goto(path)
            assert no_horizontal_overflow(page), (width, path)


def test_a_check_that_passed_with_a_count_shows_as_a_pass_saying_it(page: Page, site: str,
                                                                     settings: Settings) -> None:
    # the Failure Agent stores its own checks as "ok: <count> ..." (service/agents/failure.py);
    # the rule is dated long ago so it sorts last among the pending ones the other tests use
    rule_id = "failure_agent.ecc-checks-shown"
    database = Database(settings.database_url)
    try:
        with database.session() as db:
            store.add_rule(db, actor="failure_agent", id=rule_id, kind="diagnosis", source="failure_agent",
                           scope="global", patterns=[r"ECC uncorrectable error on GPU (?P<gpu>\d+)"],
                           reason="ecc_error", tier="cause", origin="infrastructure",
                           action="cordon_and_restart", created_at=datetime(2001, 1, 1, tzinfo=UTC),
                           provenance={"evidence": ["ECC uncorrectable error on GPU 3"], "validation": {
                               "syntax": "ok", "claims": "ok", "history": "ok: 122 confirmed lines",
                               "jobs": "ok: 7 confirmed jobs", "this_case": "ok"}})
    finally:
        database.close()
    try:
        sign_in(page)
        checks = page.locator(f"section[id='rule-{rule_id}'] .checks")
        expect(checks.locator("> span.ok")).to_have_count(5)
        expect(checks.locator("> span.bad")).to_have_count(0)
        passed = checks.locator("> span.ok")
        expect(passed.filter(has_text="history")).to_contain_text("✓ history (122 confirmed lines)")
        expect(passed.filter(has_text="jobs")).to_have_attribute("title", "jobs: ok: 7 confirmed jobs")
        page.goto(f"/admin/rule/{rule_id}")
        expect(page.locator("main .checks")).to_contain_text("✓ jobs (7 confirmed jobs)")
        expect(page.locator("main .checks > span.bad")).to_have_count(0)
        assert page.dialogs == [] and page.console_errors == []
    finally:
        api(site, "POST", f"/admin/rules/{rule_id}/reject", json={"reason": "a test's rule"})


def jobs_table(page: Page):
    return page.locator("table.jobs")


def test_the_job_list_shows_action_and_suspect_nodes_and_a_search_finds_jobs(page: Page) -> None:
    sign_in(page)
    head = jobs_table(page).locator("thead th")
    expect(head.nth(3)).to_have_text("action")
    expect(head.nth(4)).to_have_text("suspect nodes")
    ecc = jobs_table(page).locator("tbody tr", has=page.get_by_role("link", name=ECC_NAME, exact=True))
    expect(ecc.locator("td.action")).to_have_text("cordon_and_restart")
    expect(ecc.locator("td.nodes")).to_have_text(ECC_NODE)
    megatron = jobs_table(page).locator("tbody tr",
                                        has=page.get_by_role("link", name=MEGATRON_NAME, exact=True))
    expect(megatron.locator("td.action")).to_have_text("fix_and_resubmit")
    expect(megatron.locator("td.nodes")).to_have_text("—")

    page.get_by_role("searchbox", name="search jobs").fill(ECC_NODE.upper())
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"/admin\?q=TRN-B05"))
    expect(page.locator("h2#jobs")).to_contain_text(f"Jobs matching “{ECC_NODE.upper()}”")
    expect(jobs_table(page).locator("tbody tr")).to_have_count(1)
    expect(jobs_table(page)).to_contain_text(ECC_NAME)
    expect(jobs_table(page)).not_to_contain_text(MEGATRON_NAME)
    expect(page.get_by_role("searchbox", name="search jobs")).to_have_value(ECC_NODE.upper())

    page.get_by_role("searchbox", name="search jobs").fill("gpt-7b-2025")
    page.get_by_role("button", name="Search").click()
    expect(jobs_table(page).locator("tbody tr")).to_have_count(1)
    expect(jobs_table(page)).to_contain_text(MEGATRON_NAME)
    expect(jobs_table(page)).not_to_contain_text(ECC_NAME)

    page.get_by_role("searchbox", name="search jobs").fill("no-such-node-zz9")
    page.get_by_role("button", name="Search").click()
    expect(jobs_table(page).locator("tbody")).to_have_text("No job matches “no-such-node-zz9”.")
    page.get_by_role("link", name="show all").click()
    expect(jobs_table(page)).to_contain_text(ECC_NAME)
    expect(jobs_table(page)).to_contain_text(MEGATRON_NAME)
    assert no_horizontal_overflow(page)
    assert page.dialogs == [] and page.console_errors == []


def test_a_diagnosis_is_corrected_by_clicking_and_the_correction_is_stored(page: Page, site: str) -> None:
    sign_in(page)
    page.get_by_role("link", name=DATA_JOB_NAME).click()
    job_id = page.url.rsplit("/", 1)[-1]
    review = page.locator("#review")
    expect(review.get_by_label("Right reason")).to_have_value("connection_error")  # what the diagnosis said
    review.get_by_label("Right reason").select_option("s3_storage_error")
    review.get_by_label("Origin").select_option("infrastructure")
    review.get_by_label("note on correcting").fill("the object store was down, not the rendezvous")
    review.get_by_role("button", name="Correct").click()

    expect(page).to_have_url(re.compile(rf"/admin/job/{job_id}\?done=correct$"))
    expect(page.get_by_role("status")).to_contain_text("Corrected the diagnosis")
    expect(page.locator("#review .confirmed")).to_have_text(re.compile(
        r"Corrected by admin \(\d{4}-\d\d-\d\d [\d:]{8}\): s3_storage_error, origin infrastructure · "
        r"note: the object store was down, not the rendezvous"))
    audit = api(site, "GET", "/admin/audit", params={"target": job_id, "action": "job.confirm"})
    entries = audit.json()["data"]
    assert [(e["actor"], e["details"]["reason"], e["details"]["origin"], e["details"]["corrected"])
            for e in entries] == [("admin", "s3_storage_error", "infrastructure", True)]
    assert no_horizontal_overflow(page)
    assert page.dialogs == [] and page.console_errors == []
