"""One error hierarchy for the service and the CLI; each class knows its HTTP status."""

from __future__ import annotations


class FaultlineError(Exception):
    status_code = 500
    """HTTP status; the CLI exits 2 for every subclass marked as the caller's fault."""
    headers: dict[str, str] | None = None

    def __init__(self, message: str = "", **extra: object):
        super().__init__(message)
        self.extra = extra
        """More fields for the JSON error body (e.g. the validator's checks)."""


class BadInput(FaultlineError):
    status_code = 400


class Unauthorized(FaultlineError):
    status_code = 401


class Forbidden(FaultlineError):
    status_code = 403


class NotFound(FaultlineError):
    status_code = 404


class Conflict(FaultlineError):
    status_code = 409


class PayloadTooLarge(FaultlineError):
    status_code = 413


class Unprocessable(FaultlineError):
    status_code = 422


class Busy(FaultlineError):
    """Too much contention right now; the client should retry (the sidecar does)."""

    status_code = 503
    headers = {"Retry-After": "1"}


class DatabaseUnavailable(FaultlineError):
    """The database could not be reached at start, after retrying."""

    status_code = 503


class ConfigError(FaultlineError):
    """A setting is missing or unsafe; the service refuses to start."""


class UnsupportedMediaType(FaultlineError):
    status_code = 415
