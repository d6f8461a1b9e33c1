"""The server builds the Failure Agent at start, in the background: /healthz answers at once,
says `loading` until the model and knowledge base are ready, then `ready`; with the preload
off it says `on first use`, with the agent off `off`."""

from __future__ import annotations

import time

import httpx

from service.settings import Settings
from tests.support.server import running_server


def _states(url: str, seconds: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/healthz", timeout=10)
        assert r.status_code == 200
        state = r.json()["failure_agent"]
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "ready":
            break
        time.sleep(0.05)
    return seen


def test_the_server_preloads_the_failure_agent_and_healthz_says_when_it_is_ready(tmp_path) -> None:
    # no shared model: the server loads the real one itself, as in production
    settings = Settings(data_dir=tmp_path, admin_enabled=False, preload_failure_agent=True)
    with running_server(settings, startup_timeout_s=120) as url:
        seen = _states(url, 240)
    assert seen[-1] == "ready" and set(seen) <= {"loading", "ready"}, seen


def test_without_the_preload_it_is_built_on_first_use(tmp_path) -> None:
    with running_server(Settings(data_dir=tmp_path, admin_enabled=False)) as url:
        assert httpx.get(f"{url}/healthz", timeout=10).json()["failure_agent"] == "on first use"
    with running_server(Settings(data_dir=tmp_path / "off", admin_enabled=False, failure_agent=False)) as url:
        assert httpx.get(f"{url}/healthz", timeout=10).json()["failure_agent"] == "off"
