"""Admin authentication: bearer tokens with owner labels, compared in constant time, and
the signed session cookie and CSRF tokens of the /admin web page.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, against every known token
without stopping at the first match, so neither the token's content nor which owner it
belongs to shows in the response time.

The web page signs in with the same token once; the cookie then holds the owner's label,
an expiry and a random nonce, signed with HMAC under a key derived from that owner's token:
every worker process can check it without shared state, and changing or removing a token
ends its sessions. Signing out ends one: the audit log records it and every worker looks
there before taking a cookie. Each form carries a CSRF token, an HMAC of the session nonce; the cookie
is also `SameSite=Strict` and `HttpOnly`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from service.access import bearer_token, matching
from service.access import digest as _digest
from service.api.schema import ADMIN_TOKEN
from service.errors import Forbidden, NotFound
from service.settings import Settings


SESSION_COOKIE = "faultline_admin"
SESSION_TTL_S = 8 * 3600


@dataclass(frozen=True)
class WebSession:
    label: str
    nonce: str
    expires: int

    @property
    def ref(self) -> str:
        """What the audit log keeps of a session that was signed out (a digest: the nonce
        itself stays in the cookie), so every worker refuses its cookie from then on."""
        return "session:" + hashlib.sha256(self.nonce.encode()).hexdigest()[:32]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class AdminTokens:
    def __init__(self, credentials: list[tuple[str, str]]):
        self._digests = [(label, _digest(token)) for label, token in credentials]
        self._keys = {label: hmac.new(digest, b"faultline-admin-session", hashlib.sha256).digest()
                      for label, digest in self._digests}

    # -- web sessions ------------------------------------------------------------------------------
    def new_session(self, label: str) -> tuple[WebSession, str]:
        """A session for a signed-in owner, and its cookie value."""
        session = WebSession(label, secrets.token_urlsafe(18), int(time.time()) + SESSION_TTL_S)
        payload = _b64(json.dumps({"l": session.label, "n": session.nonce, "e": session.expires}).encode())
        signature = hmac.new(self._keys[label], payload.encode(), hashlib.sha256).hexdigest()
        return session, f"{payload}.{signature}"

    def read_session(self, cookie: str | None) -> WebSession | None:
        """The session of a cookie whose signature, owner and expiry hold, else None."""
        if not cookie or "." not in cookie or len(cookie) > 4096:
            return None
        payload, _, signature = cookie.rpartition(".")
        try:
            data = json.loads(_unb64(payload))
            label, nonce, expires = str(data["l"]), str(data["n"]), int(data["e"])
        except (ValueError, KeyError, TypeError):
            return None
        key = self._keys.get(label)
        if key is None:
            return None
        expected = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature) or expires < time.time():
            return None
        return WebSession(label, nonce, expires)

    def csrf_token(self, session: WebSession) -> str:
        return hmac.new(self._keys[session.label], b"csrf:" + session.nonce.encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, session: WebSession, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf_token(session), str(presented))

    @classmethod
    def from_settings(cls, settings: Settings) -> AdminTokens:
        return cls(settings.admin_credentials() if settings.admin_enabled else [])

    def owner(self, presented: str) -> str | None:
        """The label of the token presented, or None."""
        return matching(presented, self._digests)

    def __bool__(self) -> bool:
        return bool(self._digests)


def require_admin(request: Request, _documented: HTTPAuthorizationCredentials | None = Security(ADMIN_TOKEN)) -> str:
    """FastAPI dependency: the owner label of a valid admin token (401 none, 403 wrong).
    `_documented` only puts the scheme into OpenAPI; the header is read here."""
    tokens: AdminTokens = request.app.state.admin_tokens
    if not tokens:
        raise NotFound("the admin API is disabled (FAULTLINE_ADMIN_ENABLED=false)")
    owner = tokens.owner(bearer_token(request, what="<FAULTLINE_ADMIN_TOKEN>"))
    if owner is None:
        raise Forbidden("the admin token is not valid")
    return owner
