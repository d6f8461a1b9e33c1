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


def test_a_shutdown_while_it_loads_does_not_wait_for_the_build(tmp_path) -> None:
    """SIGTERM while the model loads (a deploy, a container stop): the server stops the build
    at its next batch and waits for it only PRELOAD_STOP_WAIT_S, instead of the whole build
    (a model load it cannot interrupt took longer than a container's grace period here)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.server import free_port

    port = free_port()
    env = {**os.environ, "FAULTLINE_DATA_DIR": str(tmp_path), "FAULTLINE_ADMIN_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env=env,
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, state = time.monotonic() + 120, None
        while time.monotonic() < deadline and state != "loading":
            try:
                state = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()["failure_agent"]
            except httpx.TransportError:
                time.sleep(0.1)
        assert state == "loading", state
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # a guard against a hang, not a speed goal
        # uvicorn re-raises the signal once it has shut down cleanly: the exit says SIGTERM
        assert proc.returncode in (0, -signal.SIGTERM) and b"Application shutdown complete" in err, err[-2000:]
        assert b"could not be preloaded" not in err  # a stop is not a failure to report
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
