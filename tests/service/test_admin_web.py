"""The /admin web page on a real server: sign-in, the signed session cookie, CSRF-checked
forms, escaped log text, approve from the page and see the next diagnosis use the rule,
reject and edit errors shown on the page, dry-run, the job page with its loss curve."""

from __future__ import annotations

import html
import re

import httpx
import markupsafe
import pytest

from fixtures.logs.unknown_formats import helix_log
from service.settings import Settings
from tests.support.server import running_server

TOKEN = "web-5e8b2d7f1c9a0364"
CAROL = "carol-93d1f0b7a2e6c548"
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
ITERATION = ("[default0]: [2025-03-31 05:54:07] iteration {step:>8}/  242204 | consumed samples:        50400 | "
             "elapsed time per iteration (ms): 1552.8 | learning rate: 8.000000E-06 | global batch size:  1008 | "
             "lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | "
             "number of nan iterations:   0 |")
MEGATRON = "\n".join(ITERATION.format(step=s, loss=6.0 - s * 0.01) for s in range(10, 410, 10)) + \
    f"\n[default3]:KeyError: '{HOSTILE}'\n"
HELIX = helix_log(steps=3000, nodes=1, ranks_per_node=8, seed=61, failure="keyerror").text()


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("web-data"), admin_token=TOKEN, admin_tokens=f"carol:{CAROL}")
    with running_server(settings) as url:
        for params, body in (({}, HELIX), ({"job_name": "gpt-7b-20250331-ab12cd", "framework": "megatron"}, MEGATRON)):
            assert httpx.post(f"{url}/diagnose", content=body, params=params, timeout=120).status_code == 200
        yield url


@pytest.fixture
def browser(site):
    """A signed-in client (as carol), like a browser keeping its cookie."""
    with httpx.Client(base_url=site, follow_redirects=False, timeout=120) as client:
        r = client.post("/admin/login", data={"token": CAROL})
        assert r.status_code == 303 and r.headers["location"] == "/admin"
        yield client


def pending_ids(page: str) -> list[str]:
    return re.findall(r'<section class="card" id="rule-([^"]+)">', page)


def test_the_page_needs_a_signed_in_session(site) -> None:
    with httpx.Client(base_url=site, follow_redirects=False, timeout=30) as anon:
        for path in ("/admin", "/admin/rule/x", "/admin/job/x"):
            r = anon.get(path)
            assert r.status_code == 303 and r.headers["location"] == "/admin/login", path
        assert anon.post("/admin/rule/x/approve", data={"csrf": "0" * 64}).status_code == 303
        login = anon.get("/admin/login")
        assert login.status_code == 200 and 'type="password"' in login.text
        wrong = anon.post("/admin/login", data={"token": TOKEN + "x"})
        assert wrong.status_code == 403 and "not valid" in wrong.text and "faultline_admin" not in wrong.headers.get(
            "set-cookie", "")
        forged = anon.get("/admin", cookies={"faultline_admin": "eyJsIjogImNhcm9sIn0.deadbeef"})
        assert forged.status_code == 303
        ok = anon.post("/admin/login", data={"token": TOKEN})
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin" in cookie
        assert TOKEN not in cookie


def test_dashboard_shows_pending_rules_and_recent_jobs_with_log_text_escaped(browser) -> None:
    r = browser.get("/admin")
    assert r.status_code == 200 and "signed in as <strong>carol</strong>" in r.text
    assert "default-src 'none'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
    assert "<script" not in r.text.lower() and "<img" not in r.text.lower()
    assert str(markupsafe.escape(HOSTILE))[:40] in r.text  # the log line is there, as text
    assert len(pending_ids(r.text)) >= 3
    assert "Evidence" in r.text and "votes 5/5" in r.text and "✓ no_error_lines" in r.text
    assert "gpt-7b-20250331-ab12cd" in r.text and "<polyline points=" in r.text  # the job reported losses
    assert "key_error" in r.text and "step 400" in r.text


def test_forms_need_the_csrf_token_and_this_origin(browser, site) -> None:
    page = browser.get("/admin").text
    rule_id = pending_ids(page)[-1]
    for data, headers in (({}, {}), ({"csrf": "0" * 64}, {}),
                          ({"csrf": csrf_of(page)}, {"Origin": "https://evil.example"})):
        r = browser.post(f"/admin/rule/{rule_id}/approve", data=data, headers=headers)
        assert r.status_code == 403, (data, headers)
    r = httpx.get(f"{site}/admin/rules/{rule_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json()["status"] == "pending"


def test_approve_on_the_page_then_a_new_diagnosis_uses_the_rule(browser, site) -> None:
    page = browser.get("/admin").text
    rule_id = pending_ids(page)[0]
    before = httpx.post(f"{site}/diagnose", content=HELIX, timeout=120).json()
    assert rule_id not in {f["rule"] for f in before["filtered"]}
    r = browser.post(f"/admin/rule/{rule_id}/approve", data={"csrf": csrf_of(page), "next": "/admin"},
                     headers={"Origin": site})
    assert r.status_code == 303 and r.headers["location"].startswith("/admin?done=approve")
    after_page = browser.get(r.headers["location"])
    assert f"Approved {rule_id}" in after_page.text and rule_id not in pending_ids(after_page.text)
    assert "rule.active" in after_page.text  # the rule history
    after = httpx.post(f"{site}/diagnose", content=HELIX, timeout=120).json()
    assert {f["rule"]: f["count"] for f in after["filtered"]}.get(rule_id, 0) > 0
    rule = httpx.get(f"{site}/admin/rules/{rule_id}", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert rule["status"] == "active" and rule["audit"][0]["actor"] == "carol"


def test_reject_and_edit_errors_are_shown_and_change_nothing(browser) -> None:
    page = browser.get("/admin").text
    rule_id = pending_ids(page)[1]
    csrf = csrf_of(page)
    r = browser.post(f"/admin/rule/{rule_id}/reject", data={"csrf": csrf, "reason": "  "})
    assert r.status_code == 422 and "a reason is required" in r.text
    r = browser.post(f"/admin/rule/{rule_id}/edit", data={"csrf": csrf, "pattern": ".*", "description": "d",
                                                          "scope": "global"})
    assert r.status_code == 422 and "no_error_lines" in r.text and "d" in r.text
    r = browser.post(f"/admin/rule/{rule_id}/edit", data={"csrf": csrf, "pattern": "x", "scope": "mars"})
    assert r.status_code == 422 and "scope must be" in r.text
    rule_page = browser.get(f"/admin/rule/{rule_id}").text
    assert "<td>1</td><td>created</td>" in rule_page and "<td>2</td>" not in rule_page
    r = browser.post(f"/admin/rule/{rule_id}/reject", data={"csrf": csrf, "reason": "too broad <b>really</b>"})
    assert r.status_code == 303
    shown = browser.get(r.headers["location"]).text
    assert "too broad &lt;b&gt;really&lt;/b&gt;" in shown and "s-rejected" in shown


def test_edit_and_dry_run_from_the_rule_page(browser) -> None:
    page = browser.get("/admin").text
    rule_id = pending_ids(page)[2]
    rule_page = browser.get(f"/admin/rule/{rule_id}")
    assert rule_page.status_code == 200 and "Versions" in rule_page.text and "Replay the stored jobs" in rule_page.text
    csrf = csrf_of(rule_page.text)
    pattern = html.unescape(re.search(r'<textarea name="pattern" rows="3" required>(.*?)</textarea>',
                                      rule_page.text, re.S).group(1))
    dry = browser.post(f"/admin/rule/{rule_id}/dry-run", data={"csrf": csrf})
    assert dry.status_code == 200 and re.search(r"<strong>[1-9]\d*</strong> of \d+ stored jobs matched", dry.text)
    r = browser.post(f"/admin/rule/{rule_id}/edit", data={"csrf": csrf, "pattern": f"(?:{pattern})",
                                                          "description": "helix chatter", "scope": "global"})
    assert r.status_code == 303 and "done=edit" in r.headers["location"]
    shown = browser.get(r.headers["location"]).text
    assert "<td>2</td><td>edited</td><td>carol</td>" in shown and "helix chatter" in shown
    assert f"Saved a new version of {rule_id}." in shown
    assert browser.get("/admin/rule/no-such-rule").status_code == 404


def test_job_page_shows_the_diagnosis_kept_lines_and_loss_curve(browser) -> None:
    page = browser.get("/admin").text
    job_id = re.search(r'<a href="/admin/job/([0-9a-f]+)">gpt-7b-20250331-ab12cd</a>', page).group(1)
    r = browser.get(f"/admin/job/{job_id}")
    assert r.status_code == 200
    assert "<polyline points=" in r.text and "at step 400" in r.text
    assert "<script" not in r.text.lower() and "KeyError: &#39;&lt;script&gt;" in r.text
    assert browser.get("/admin/job/0123").status_code == 404


def test_sign_out_ends_the_session(browser) -> None:
    page = browser.get("/admin").text
    kept = dict(browser.cookies)  # a copy of the cookie, as someone who saw it would keep it
    r = browser.post("/admin/logout", data={"csrf": csrf_of(page)})
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    assert browser.get("/admin").status_code == 303
    # the server ended the session itself: the kept cookie no longer signs anyone in
    replay = httpx.get(str(browser.base_url.join("/admin")), cookies=kept, follow_redirects=False)
    assert replay.status_code == 303 and replay.headers["location"] == "/admin/login"


def test_the_page_says_only_its_own_words_after_an_action(browser) -> None:
    """A link cannot put its own text in the page's status line."""
    for query in ({"msg": "Session expired: sign in at https://evil.example"},
                  {"done": "approve", "rule": "x: now sign in at https://evil.example"},
                  {"done": "hacked", "rule": "la-0123456789ab"}):
        page = browser.get("/admin", params=query).text
        assert 'role="status"' not in page and "evil.example" not in page, query
    page = browser.get("/admin", params={"done": "reject", "rule": "la-0123456789ab"}).text
    assert '<p class="flash" role="status">Rejected la-0123456789ab.</p>' in page
