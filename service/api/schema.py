"""What the OpenAPI document says beyond the routes' own models: the error body every route
answers with, the status codes each group of routes can give, and the bearer schemes.

The schemes are declared through FastAPI's HTTPBearer (auto_error off) so that /docs shows
them and offers an Authorize button; the checks themselves stay in service/access.py and
service/admin/auth.py, which read the same header and answer with this error body."""

from __future__ import annotations

from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict


class ErrorBody(BaseModel):
    """Every error: a message meant for a person, and the HTTP status again."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "examples": [{"error": "job 3f2a9c1e is not known", "status": 404}]})
    error: str
    status: int


API_TOKEN = HTTPBearer(auto_error=False, scheme_name="apiToken", description=(
    "A token of FAULTLINE_API_TOKENS with the route's scope (`ingest` or `read`; `admin` may do all). "
    "With no token configured the job API is open."))
ADMIN_TOKEN = HTTPBearer(auto_error=False, scheme_name="adminToken",
                         description="An admin token (FAULTLINE_ADMIN_TOKEN or FAULTLINE_ADMIN_TOKENS).")

_MEANING = {
    400: "The request cannot be read (a malformed body or upload).",
    401: "No bearer token, or one that is not valid, while tokens are configured.",
    403: "The token lacks the scope this route needs (or the admin token is wrong).",
    404: "No such job or rule (or the admin API is disabled).",
    409: "The request conflicts with the stored state (a finished job, a rule's status).",
    413: "The upload is larger than the limits allow.",
    415: "The content type is not one the route reads.",
    422: "A parameter or the body is not valid.",
    503: "The database is unavailable or busy: retry after Retry-After seconds.",
}


def error_responses(*codes: int) -> dict[int | str, dict]:
    """OpenAPI `responses` for these status codes, each with the error body."""
    return {code: {"model": ErrorBody, "description": _MEANING[code]} for code in codes}


DIAGNOSE_ERRORS = error_responses(400, 401, 403, 413, 415, 422, 503)
JOB_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 422, 503)
ADMIN_ERRORS = error_responses(401, 403, 404, 409, 422, 503)
