"""A schemathesis run against the app's own OpenAPI schema, on a real server: whatever the
generated requests hold (path, query, headers, bodies), no answer is a server error (5xx),
and every answer has the shape the schema documents. Bounded (a fixed number of examples
per operation) and deterministic (derandomized)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from service.app import create_app
from service.settings import Settings
from tests.service.test_http import LOG
from tests.support.server import running_server

TOKEN = "fuzz-admin-token-9d2e4b7a1c"
EXAMPLES_PER_OPERATION = 30


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[str]:
    config = Settings(data_dir=tmp_path_factory.mktemp("fuzz"), admin_token=TOKEN, max_request_bytes=1_000_000)
    with running_server(config) as url:
        # something to find: a stored job, so lookups and dry runs have data to chew on
        httpx.post(f"{url}/diagnose", params={"job_name": "gpt-7b-20241103-ab12cd"}, content=LOG,
                   headers={"Content-Type": "text/plain"}, timeout=60).raise_for_status()
        yield url


@schemathesis.serializer("application/x-ndjson")
def _ndjson(_ctx, value) -> bytes:
    """POST /ingest/records takes JSON lines: a generated string goes as it is, anything
    else as one JSON line (schemathesis has no serializer of its own for this type)."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else json.dumps(value).encode()


# the schema of the app the server runs (only built here, never started: no database opened)
schema = schemathesis.openapi.from_dict(create_app(Settings(admin_token=TOKEN, database_url="sqlite://")).openapi())
# valid requests and requests the schema forbids (wrong types, missing fields, bad headers)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], deterministic=True)


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_no_request_the_schema_allows_or_forbids_gets_a_server_error(case, api: str) -> None:
    for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):
        # and every answer is what the schema documents (the routes return plain dicts: only
        # this check holds them to their documented models)
        case.call_and_validate(base_url=api, headers=headers, checks=[not_a_server_error, response_schema_conformance],
                               timeout=60)
