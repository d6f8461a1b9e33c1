"""Settings from FAULTLINE_* environment variables or a config file; offline defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict,
                               TomlConfigSettingsSource)

from service.errors import ConfigError

PLACEHOLDER_TOKENS = frozenset({"", "changethis", "change-me", "changeme", "secret", "admin", "token", "test"})


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "faultline"


def default_database_url(data_dir: Path) -> str:
    """The embedded default: a SQLite file in the data dir. (The test suite's PostgreSQL run
    replaces this one function, so every test's data dir gets a database of its own.)"""
    return f"sqlite:///{data_dir / 'faultline.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAULTLINE_", env_ignore_empty=True, extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    """Where the SQLite file, the vector index and the sidecar's offsets live by default."""
    database_url: str = ""
    """SQLAlchemy URL; empty means a SQLite file in data_dir. `postgresql://` uses psycopg 3."""
    db_auto_upgrade: bool = True
    """Bring the schema to the newest migration at start (under a lock, so replicas may start
    together). Off: run `faultline db upgrade` first; the service refuses an older schema."""
    db_pool_size: int = Field(default=10, ge=1)
    """PostgreSQL connections each process keeps open."""
    db_max_overflow: int = Field(default=20, ge=0)
    db_pool_timeout_s: float = Field(default=10.0, gt=0)
    db_connect_timeout_s: int = Field(default=5, ge=1)
    db_start_wait_s: float = Field(default=60.0, ge=0)
    """How long start-up waits for a database it cannot reach (a PostgreSQL that starts with
    the service, a network still coming up), retrying with backoff, before it gives up."""

    llm_base_url: str = ""
    """An OpenAI-compatible endpoint (vLLM, Ollama, llama.cpp, OpenAI); empty: embedded agents."""
    llm_model: str = ""
    llm_api_key: SecretStr = SecretStr("")
    llm_timeout_s: float = 30.0
    llm_max_retries: int = 2
    llm_max_tokens: int = 1024

    log_agent: bool = True
    """Run the Log Agent (learn filter rules) during diagnose and compress."""
    log_agent_votes: int = Field(default=5, ge=1, le=15)
    """K: independent proposals per segment (self-consistency)."""
    log_agent_agreement: float = Field(default=0.5, gt=0.0, le=1.0)
    """A proposal wins with more than this share of the K votes."""
    log_agent_segment_lines: int = Field(default=256, ge=8)
    log_agent_segment_bytes: int = Field(default=64 << 10, ge=1024)
    log_agent_segment_seconds: float = Field(default=30.0, gt=0.0)
    """Live jobs: a segment closes when its oldest line is this old."""
    log_agent_min_support: int = Field(default=3, ge=1)
    log_agent_max_rules: int = Field(default=100, ge=1)
    """Rules one job may learn."""
    log_agent_temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    log_agent_prompt_tokens: int = Field(default=3000, ge=100)
    """Token budget for the log lines of one segment in an LLM prompt."""
    log_agent_max_llm_calls: int = Field(default=60, ge=1)
    """LLM calls per job; past it the embedded miner takes over."""
    failure_agent: bool = True
    """Run the Failure Agent when no rule resolves a failure (loads the embedding model then)."""
    preload_failure_agent: bool = True
    """`serve`: build the Failure Agent (embedding model, knowledge base) in the background at
    start, so the first log no rule explains does not wait seconds for it; /healthz says
    `failure_agent: loading` until it is ready. Off: built on first use."""
    failure_agent_attempts: int = Field(default=3, ge=1, le=10)
    """LLM answers tried (an invalid one is retried with the problem named) before the
    embedded decision is used."""
    auto_accept_rules: bool = False
    """Accept agent-suggested diagnosis rules without review (they are still validated)."""

    admin_enabled: bool = True
    admin_token: SecretStr = SecretStr("")
    admin_token_label: str = "admin"
    """Who the audit log names for what is done with admin_token."""
    admin_tokens: SecretStr = SecretStr("")
    """More admin tokens, each with its owner's label: `alice:<token>,bob:<token>`."""
    api_tokens: SecretStr = SecretStr("")
    """Tokens of the job API, `name:scopes:token,...`, scopes joined by `+` from `ingest`
    (POST /diagnose, create, append to and finish live jobs), `read` (jobs, their diagnoses
    and lines) and `admin` (the admin API and page). None: the job API is open, and
    `faultline serve` binds a non-loopback address only when told --insecure."""

    max_request_bytes: int = 2 << 30
    max_concurrent_uploads: int = Field(default=8, ge=1)
    """POST /diagnose requests one process works on at once; more wait, their bodies unread
    (bounds memory, keeps /healthz answering under load)."""
    max_parallel_diagnoses: int = Field(default=2, ge=1)
    """Of those, how many filter and diagnose at the same moment (CPU work in threads: more
    than the cores only contend for the GIL); the others wait between buffers of their body."""
    max_gzip_ratio: int = 200
    max_chunk_bytes: int = 64 << 20

    webhook_url: str = ""
    """Where notifications are POSTed (JSON) when a live job fails, stalls or its loss spikes."""
    webhook_secret: SecretStr = SecretStr("")
    """Key of the HMAC-SHA256 signature header (`X-Faultline-Signature: sha256=<hex>`)."""
    webhook_timeout_s: float = Field(default=10.0, gt=0.0)
    webhook_max_attempts: int = Field(default=8, ge=1, le=50)
    webhook_backoff_s: float = Field(default=2.0, gt=0.0)
    """First retry delay; it doubles with each attempt (capped at webhook_backoff_max_s)."""
    webhook_backoff_max_s: float = Field(default=600.0, gt=0.0)
    slack_webhook_url: SecretStr = SecretStr("")
    """A Slack-compatible incoming webhook (Mattermost, Rocket.Chat) for a message people read,
    beside or instead of the signed webhook; the URL holds its token, so it is a secret."""
    public_url: str = ""
    """The service's address as people reach it: chat messages link to the job's page there."""

    server_url: str = ""
    """The service `faultline tail` sends to when no --server is given."""
    token: SecretStr = SecretStr("")
    """The sidecar's bearer token for a server with FAULTLINE_API_TOKENS (scopes ingest+read);
    `faultline tail --token-file F` reads it from a file instead."""

    node_file_pattern: str = ""
    """A regular expression (RE2) with a `node` group, e.g. `(?P<node>gpu-\\d+)\\.log$`: a log
    file whose name it matches stands for that node, and no other file name names a node. Unset:
    a file named like a host does, one named for a rank, a worker or an attempt does not."""

    restart_budget: int = Field(default=3, ge=1, le=100)
    """Attempts of one job (same external_id) that may end in the same root cause, with no
    training progress between them, before the action becomes `stop`."""

    hang_floor_s: float = Field(default=30 * 60, gt=0.0)
    """A live job is never stalled before this many seconds without progress."""
    hang_step_factor: float = Field(default=20.0, gt=0.0)
    """k: stalled after k times the job's median time between progress reports."""
    hang_check_interval_s: float = Field(default=30.0, gt=0.0)
    """How often each replica sweeps its live jobs for stalls (GET /jobs/{id} checks too)."""
    live_cached_jobs: int = Field(default=16, ge=0)
    """Live jobs whose processing state a replica keeps in memory between appends."""

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _config_file_source(settings_cls), file_secret_settings

    @field_validator("llm_base_url", "webhook_url", "server_url", "public_url")
    @classmethod
    def _check_url(cls, value: str, info: Any) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"FAULTLINE_{info.field_name.upper()} must be an http(s) URL, got {value!r}")
        return value.rstrip("/") if info.field_name == "llm_base_url" else value

    @field_validator("node_file_pattern")
    @classmethod
    def _check_node_file_pattern(cls, value: str) -> str:
        if value:
            from rules.job import node_file_matcher

            node_file_matcher(value)  # ValueError naming what is wrong
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        if not self.database_url:
            self.database_url = default_database_url(self.data_dir)
        if self.llm_base_url and not self.llm_model:
            raise ValueError("FAULTLINE_LLM_MODEL must be set when FAULTLINE_LLM_BASE_URL is")
        slack = self.slack_webhook_url.get_secret_value()
        if slack and not slack.startswith(("http://", "https://")):
            raise ValueError("FAULTLINE_SLACK_WEBHOOK_URL must be an http(s) URL")
        if self.webhook_url and not self.webhook_secret.get_secret_value():
            # an unsigned webhook lets anyone who can reach the hook drain nodes
            raise ValueError("FAULTLINE_WEBHOOK_SECRET must be set when FAULTLINE_WEBHOOK_URL is")
        return self

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm_base_url)

    def api_credentials(self) -> list[tuple[str, frozenset[str], str]]:
        """(name, scopes, token) of every job API token; ConfigError on a malformed entry."""
        out = []
        for item in self.api_tokens.get_secret_value().split(","):
            if not item.strip():
                continue
            name, _, rest = item.strip().partition(":")
            scopes, sep, token = rest.partition(":")
            wanted = frozenset(s.strip() for s in scopes.split("+") if s.strip())
            if not sep or not name.strip() or not wanted:
                raise ConfigError("FAULTLINE_API_TOKENS must be `name:scopes:token` entries separated by commas, "
                                  "scopes joined by `+` (e.g. `cluster-a:ingest+read:<token>`)")
            unknown = sorted(wanted - set(API_SCOPES))
            if unknown:
                raise ConfigError(f"FAULTLINE_API_TOKENS: {name.strip()!r} has unknown scope(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(API_SCOPES)}")
            if is_placeholder(token.strip()):
                raise ConfigError(f"FAULTLINE_API_TOKENS: the token of {name.strip()!r} is a placeholder or shorter "
                                  f"than {MIN_TOKEN_CHARS} characters")
            out.append((name.strip(), wanted, token.strip()))
        names = [name for name, _, _ in out]
        if len(set(names)) != len(names):
            raise ConfigError("FAULTLINE_API_TOKENS: token names must be unique")
        return out

    def admin_credentials(self) -> list[tuple[str, str]]:
        """(owner label, token) of every admin token, API tokens with the `admin` scope
        included; empty tokens are left out."""
        out = [(name, token) for name, scopes, token in self.api_credentials() if "admin" in scopes]
        token = self.admin_token.get_secret_value()
        if token:
            out.append((self.admin_token_label.strip() or "admin", token))
        for item in self.admin_tokens.get_secret_value().split(","):
            if item.strip():
                label, sep, secret = item.strip().partition(":")
                if not sep or not label.strip():
                    raise ConfigError("FAULTLINE_ADMIN_TOKENS must be `label:token` pairs separated by commas")
                out.append((label.strip(), secret.strip()))
        return out

    def require_admin_token(self) -> None:
        """The service refuses to start with admin enabled and no real token, or with a
        malformed job API token."""
        self.api_credentials()
        if not self.admin_enabled:
            return
        credentials = self.admin_credentials()
        if not credentials:
            raise ConfigError(
                "FAULTLINE_ADMIN_TOKEN must be set to a secret of at least 16 characters "
                "(or set FAULTLINE_ADMIN_ENABLED=false)")
        labels = [label for label, _ in credentials]
        if len(set(labels)) != len(labels):
            raise ConfigError("admin token labels must be unique (FAULTLINE_ADMIN_TOKEN_LABEL, FAULTLINE_ADMIN_TOKENS, admin-scoped FAULTLINE_API_TOKENS)")
        for label, token in credentials:
            if is_placeholder(token):
                raise ConfigError(
                    f"the admin token of {label!r} is a placeholder or shorter than {MIN_TOKEN_CHARS} characters: "
                    "set FAULTLINE_ADMIN_TOKEN to a real secret (or FAULTLINE_ADMIN_ENABLED=false)")


MIN_TOKEN_CHARS = 16
API_SCOPES = ("ingest", "read", "admin")


def is_placeholder(token: str) -> bool:
    """Empty, a known placeholder (`changeme`, `secret`, ...), one repeated character, or short."""
    plain = token.strip().lower()
    return (plain in PLACEHOLDER_TOKENS or len(token) < MIN_TOKEN_CHARS or len(set(plain)) < 4
            or any(word in plain for word in ("changeme", "change-me", "changethis", "placeholder")))


def _config_file_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource:
    """FAULTLINE_CONFIG names a TOML file with the same keys (without the prefix), read by
    pydantic-settings' own TOML source. A file that is missing or not TOML, or a key that is
    no setting, is an error naming it: a typo must not leave a setting at its default
    without a word."""
    path = os.environ.get("FAULTLINE_CONFIG")
    if not path:
        return InitSettingsSource(settings_cls, {})
    import tomllib

    try:
        if not Path(path).is_file():
            raise OSError(f"no such file: {path}")
        source = TomlConfigSettingsSource(settings_cls, toml_file=Path(path))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read FAULTLINE_CONFIG {path!r}: {exc}") from None
    unknown = [key for key in source.toml_data if key not in Settings.model_fields]
    if unknown:
        import difflib

        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key.lower().removeprefix("faultline_"), Settings.model_fields, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"FAULTLINE_CONFIG {path!r}: unknown setting(s) {', '.join(hints)}; "
                          "keys are the FAULTLINE_* variable names in lower case, without the prefix")
    return source


def _message(error: Any) -> str:
    """A validation error that names the variable (`FAULTLINE_HANG_FLOOR_S: ...`)."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if message.startswith("FAULTLINE_") or not error.get("loc"):
        return message
    return f"FAULTLINE_{str(error['loc'][0]).upper()}: {message} (got {error.get('input')!r})"


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        messages = [_message(e) for e in exc.errors()]
        raise ConfigError("; ".join(messages) or "invalid settings") from None
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[-1] if str(exc) else "invalid settings") from None
