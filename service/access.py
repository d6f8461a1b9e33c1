"""Who may use the job API: named bearer tokens with scopes (FAULTLINE_API_TOKENS).

`ingest` creates jobs (POST /diagnose, POST /jobs), appends to and finishes them; `read` lists
jobs and reads their diagnoses and lines; `admin` is an admin token (service/admin/auth.py).
With no token configured the job API is open, as on a laptop: `faultline serve` then refuses
a non-loopback address unless told --insecure, so an open API is never reachable by accident.

Tokens are compared as SHA-256 digests with `hmac.compare_digest` against every known token,
so the response time tells nothing about which one came close.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from service.api.schema import API_TOKEN
from service.errors import Forbidden, Unauthorized
from service.settings import Settings

T = TypeVar("T")


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def matching(presented: str, known: list[tuple[T, bytes]]) -> T | None:
    """The owner of the digest that `presented` has, comparing with every known digest
    (no early exit), so the time taken says nothing of which one came close."""
    wanted = digest(presented)
    found = None
    for owner, known_digest in known:
        if hmac.compare_digest(wanted, known_digest) and found is None:
            found = owner
    return found


class BearerRequired(Unauthorized):
    headers = {"WWW-Authenticate": 'Bearer realm="faultline"'}


def bearer_token(request: Request, *, what: str = "<token>") -> str:
    """The token of an `Authorization: Bearer` header (401 when missing or malformed)."""
    header = request.headers.get("authorization", "")
    if not header.strip():
        raise BearerRequired(f"missing Authorization header: send `Authorization: Bearer {what}`")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise BearerRequired(f"Authorization must be `Bearer {what}`")
    return token.strip()


@dataclass(frozen=True)
class ApiToken:
    name: str
    scopes: frozenset[str]


class ApiTokens:
    def __init__(self, credentials: list[tuple[str, frozenset[str], str]]):
        self._known = [(ApiToken(name, scopes), digest(token)) for name, scopes, token in credentials]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiTokens:
        return cls(settings.api_credentials())

    def who(self, presented: str) -> ApiToken | None:
        """The token presented, or None."""
        return matching(presented, self._known)

    def __bool__(self) -> bool:
        return bool(self._known)


def require(*scopes: str) -> Callable[[Request], str | None]:
    """A FastAPI dependency: the name of a valid token with one of `scopes` (401 none or
    unknown, 403 without the scope); None when no token is configured (the API is open).
    The `admin` scope may do everything."""

    def check(request: Request, _documented: HTTPAuthorizationCredentials | None = Security(API_TOKEN)) -> str | None:
        # `_documented` only puts the scheme into OpenAPI; the header is read below, with our messages
        tokens: ApiTokens = request.app.state.api_tokens
        if not tokens:
            return None
        token = tokens.who(bearer_token(request, what="<FAULTLINE_API_TOKENS token>"))
        if token is None:
            raise BearerRequired("the token is not valid")
        if not token.scopes & {*scopes, "admin"}:
            raise Forbidden(f"the token {token.name!r} lacks the {' or '.join(map(repr, scopes))} scope")
        return token.name

    check.__name__ = "require_" + "_or_".join(scopes)
    return check
