"""What the OpenAPI document says beyond the routes' own models: the error body every route
answers with, the status codes each group of routes can give, and the bearer schemes.

The schemes are declared through FastAPI's HTTPBearer (auto_error off) so that /docs shows
them and offers an Authorize button; the checks themselves stay in service/access.py and
service/admin/auth.py, which read the same header and answer with this error body."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field


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


# -- what the routes answer (documentation: the routes return plain dicts, never filtered
# through these; every model takes added fields, as the contract allows) ----------------------
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RootCause(_Open):
    reason: str = Field(description="a taxonomy id (DESIGN.md), or `unknown`")
    category: str | None = Field(description="infrastructure, framework, script or training")
    origin: str = Field(description="infrastructure, user, training or unknown")
    line: str = Field(description="the exact root-cause log line")
    line_number: int | None
    file: str | None = Field(description="the file (or upload part) the line is in")
    rank: int | None
    node: str | None
    confidence: float
    source: str | None = Field(description="`rule:<id>`, `failure_agent`, `retrieval`, `progress`, ...")


class OtherError(_Open):
    reason: str | None
    line: str
    line_number: int | None = None
    count: int = 1


class Progress(_Open):
    last_step: int | None = None
    last_loss: float | None = None


class Compression(_Open):
    lines_in: int
    lines_kept: int
    bytes_in: int


class SuggestedRule(_Open):
    id: str
    kind: str = Field(description="filter or diagnosis")
    pattern: str
    status: str


class Diagnosis(_Open):
    """The contract's diagnosis (DESIGN.md, "Diagnosis (JSON)")."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "status": "failed", "root_cause": {
            "reason": "ecc_error", "category": "infrastructure", "origin": "infrastructure",
            "line": "[default4]:[rank12]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "line_number": 41586, "file": "rank12.log", "rank": 12, "node": "node-027", "confidence": 0.95,
            "source": "rule:gpu.ecc-uncorrectable"},
        "other_errors": [], "action": "cordon_and_restart", "suspect_nodes": ["node-027"],
        "mitigation": "Cordon node-027, run the GPU diagnostics, and restart from the last checkpoint.",
        "progress": {"last_step": 1200, "last_loss": 2.31},
        "compression": {"lines_in": 41600, "lines_kept": 212, "bytes_in": 10002368}, "suggested_rules": []}]})
    status: Literal["failed", "healthy", "stalled", "running"]
    root_cause: RootCause | None
    other_errors: list[OtherError] = []
    action: str = Field(description="restart, cordon_and_restart, rollback_and_skip, fix_and_resubmit, "
                                    "investigate, stop or none")
    suspect_nodes: list[str] = []
    mitigation: str = ""
    progress: Progress | None = None
    compression: Compression | None = None
    suggested_rules: list[SuggestedRule] = []


class DiagnoseAnswer(Diagnosis):
    """The diagnosis of an upload, with the id it is stored under."""

    job_id: str


class JobAnswer(_Open):
    """A job: live (fed by appends) or an upload, with its latest diagnosis."""

    id: str
    name: str
    family: str | None = None
    framework: str | None = None
    tags: list[str] = []
    status: str | None
    live: bool
    external_id: str | None = None
    lines_received: int
    bytes_received: int = 0
    created_at: str | None = Field(description="UTC, ISO 8601 with its offset")
    finished_at: str | None = None
    exit_code: int | None = None
    diagnosis: Diagnosis | None


class JobList(_Open):
    data: list[JobAnswer]
    count: int


class AppendAnswer(_Open):
    """An accepted chunk (or a resend of one: `duplicate`)."""

    job_id: str
    source: str
    file: str
    offset: int
    next_offset: int | None = Field(description="where the next chunk of this file starts")
    lines: int = Field(description="lines this chunk completes")
    duplicate: bool
    lines_received: int = Field(description="lines the job has received in all")


class SourceRow(_Open):
    source: str
    file: str
    first_offset: int
    next_offset: int
    lines: int
    bytes: int
    crc32: str = Field(description="CRC-32 of the bytes received, 8 hex digits: compare with the file's")
    chunks: int


class SourceList(_Open):
    data: list[SourceRow]
    count: int


class ShippedFile(_Open):
    source: str
    file: str
    lines: int
    duplicate: bool


class RecordsAnswer(_Open):
    job_id: str
    records: int
    lines: int
    files: list[ShippedFile]


class Rule(_Open):
    """A stored rule (learned, suggested or imported) as the review lists it."""

    id: str
    kind: str
    status: str
    scope: str
    source: str
    pattern: str
    description: str | None = None
    hits: int = 0
    version: int
    created_at: str | None = None
    updated_at: str | None = None


class RuleList(_Open):
    data: list[Rule]
    total: int
    limit: int
    offset: int


class AuditEntry(_Open):
    id: int
    at: str | None
    actor: str
    action: str
    target: str
    details: dict[str, Any] = {}


class RuleDetail(Rule):
    versions: list[dict[str, Any]] = []
    audit: list[AuditEntry] = []


class RuleVersions(_Open):
    data: list[dict[str, Any]]


class AuditList(_Open):
    data: list[AuditEntry]
    total: int
    limit: int
    offset: int


class DryRunAnswer(_Open):
    """What a rule, as it is or as edited, would change over stored jobs."""

    rule: dict[str, Any]
    jobs_scanned: int
    lines_scanned: int
    matched_jobs: int
    changed_jobs: int
    jobs: list[dict[str, Any]]


class ImportAnswer(_Open):
    """Rule ids by what the import did with each."""

    created: list[str] = []
    activated: list[str] = []
    replaced: list[str] = []
    unchanged: list[str] = []
    skipped: list[str] = []


class ConfirmAnswer(_Open):
    job_id: str
    incident: dict[str, Any]


def answers(model: type[BaseModel], description: str, status: int = 200) -> dict[int | str, dict]:
    """OpenAPI `responses` for a route's success, documented by `model` (never used to filter
    what the route returns)."""
    return {status: {"model": model, "description": description}}
