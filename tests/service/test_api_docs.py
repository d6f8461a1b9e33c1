"""The API documents itself: every operation has a response schema, the error body and the
status codes it can give, and the bearer schemes; /docs and /redoc render in a real headless
Chromium with every request outside the server refused (a cluster without a way out)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from service.app import create_app
from service.settings import Settings
from tests.service.test_admin_browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.server import running_server

TOKEN = "doc-5b8e1c7a2f4d9036"


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> dict:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("docs"), admin_token=TOKEN)).openapi()


def operations(spec: dict) -> Iterator[tuple[str, str, dict]]:
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def test_every_operation_says_what_it_answers(spec: dict) -> None:
    for method, path, op in operations(spec):
        ok = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert ok, (method, path)
        schemas = [m.get("schema") for r in ok.values() for m in r.get("content", {}).values()]
        assert any(schemas), f"{method} {path} has no response schema"
        json_schemas = [m["schema"] for r in ok.values() for t, m in r.get("content", {}).items() if "json" in t]
        # a named model with its fields, not "any object" (the YAML export is a string)
        assert all("$ref" in s for s in json_schemas), f"{method} {path} answers an unnamed object"


def test_the_diagnosis_schema_is_the_contracts(spec: dict) -> None:
    schemas = spec["components"]["schemas"]
    diagnosis = schemas["Diagnosis"]
    assert {"status", "root_cause"} <= set(diagnosis["required"]) and diagnosis.get("examples")
    assert set(schemas["RootCause"]["properties"]) >= {"reason", "category", "origin", "line", "line_number", "file",
                                                       "rank", "node", "confidence", "source"}
    assert {"id", "name", "status", "lines_received", "diagnosis"} <= set(schemas["JobAnswer"]["properties"])


def test_errors_are_documented_with_the_error_body(spec: dict) -> None:
    body = spec["components"]["schemas"]["ErrorBody"]
    assert set(body["required"]) == {"error", "status"} and body.get("examples")
    for method, path, op in operations(spec):
        if path == "/healthz":
            assert "503" in op["responses"]
            continue
        errors = {code: r for code, r in op["responses"].items() if code[0] in "45"}
        assert {"401", "403", "422", "503"} <= set(errors), (method, path, sorted(errors))
        for code, r in errors.items():
            ref = r["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody"), (method, path, code, ref)
            assert r["description"] and r["description"] != "Error"


def test_token_routes_declare_their_bearer_scheme(spec: dict) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert {name: s["scheme"] for name, s in schemes.items()} == {"apiToken": "bearer", "adminToken": "bearer"}
    for method, path, op in operations(spec):
        wanted = None if path == "/healthz" else ("adminToken" if path.startswith("/admin/") else "apiToken")
        got = [name for requirement in op.get("security", []) for name in requirement]
        assert got == ([wanted] if wanted else []), (method, path, got)


pytestmark_browser = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"Debian's chromium is not installed at {CHROMIUM}")


@pytestmark_browser
@pytest.mark.parametrize("page_path, shows", [("/docs", "/diagnose"), ("/redoc", "/diagnose")])
def test_the_docs_render_offline(tmp_path: Path, page_path: str, shows: str) -> None:
    with running_server(Settings(data_dir=tmp_path, admin_token=TOKEN)) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context()
            outside: list[tuple[str, str]] = []

            def only_the_server(route) -> None:
                if route.request.url.startswith(url):
                    route.continue_()
                else:
                    outside.append((route.request.resource_type, route.request.url))
                    route.abort()

            context.route("**/*", only_the_server)
            page = context.new_page()
            page.set_default_timeout(30_000)
            assert page.goto(f"{url}{page_path}").status == 200
            # the operations are listed, which takes the page's script, its style and /openapi.json
            expect(page.get_by_text(shows, exact=True).first).to_be_visible()
            expect(page.get_by_text("/admin/rules/{rule_id}/approve", exact=True).first).to_be_attached()
            # nothing the page needs comes from outside; ReDoc's footer asks for Redocly's
            # logo, an image whose absence changes nothing
            assert [(kind, u) for kind, u in outside if kind != "image"] == [], outside
        finally:
            browser.close()
