"""docker-compose.yml and the Dockerfile agree with the code: no Docker engine runs here, so
the files are parsed and every command and setting they use is checked against the CLI
and the settings the service really reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from service.cli import _parser
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _services() -> dict:
    return COMPOSE["services"]


def test_every_faultline_setting_in_compose_is_one_the_code_reads() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    for name, service in _services().items():
        for key in service.get("environment", {}):
            if key.startswith("FAULTLINE_"):
                assert key.removeprefix("FAULTLINE_") in fields, f"{name}: {key} is read by nothing"


def test_every_faultline_command_parses() -> None:
    commands = [s["command"] for s in _services().values() if s.get("command", [None])[0] == "faultline"]
    dockerfile_cmd = re.search(r'^CMD (\[.*\])$', (ROOT / "Dockerfile").read_text(), re.M).group(1)
    commands.append(yaml.safe_load(dockerfile_cmd))
    assert commands
    for command in commands:
        args = command if isinstance(command, list) else shlex.split(command)
        _parser().parse_args(args[1:])


def test_service_uses_postgres_and_a_real_admin_token() -> None:
    env = _services()["faultline"]["environment"]
    assert env["FAULTLINE_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert ":?" in env["FAULTLINE_ADMIN_TOKEN"], "compose must refuse to start without a token"
    assert _services()["faultline"]["deploy"]["replicas"] >= 2
