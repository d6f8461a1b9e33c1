"""What a sidecar is told to do (`faultline tail` flags), shared by its run loop and its
sender."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from service.sidecar.tailer import TailConfig


@dataclass(frozen=True)
class SidecarConfig:
    server: str
    job_name: str
    paths: tuple[str, ...]
    state_dir: Path
    tail: TailConfig = field(default_factory=TailConfig)
    framework: str | None = None
    tags: tuple[str, ...] = ()
    job_key: str | None = None
    """The scheduler's id (Slurm job id, pod uid): sidecars of one job on several nodes share it."""
    buffer_bytes: int = 32 << 20
    poll_interval_s: float = 0.2
    glob_interval_s: float = 1.0
    drain_timeout_s: float = 60.0
    """At the end: how long to keep trying to deliver what is left."""
    retry_max_s: float = 10.0
    request_timeout_s: float = 60.0
    gzip: bool = False
    once: bool = False
    """Read what is there, send it, exit (an epilog)."""
    exit_code: int | None = None
    """With once: report this exit status (finish the job)."""
    finish_on_stop: bool = False
    """Follow mode: report the end of the job when stopped (SIGTERM), e.g. as a pod's sidecar."""
    exit_code_file: Path | None = None
    """Where the training writes its exit status, read when finishing."""
    command: tuple[str, ...] = ()
    tee: Path | None = None
    error_files: tuple[str, ...] = ()
    """Globs of torchrun error files (`@record`, TORCHELASTIC_ERROR_FILE), sent once the job ends."""
    token: str | None = field(default=None, repr=False)
    """Bearer token for a server with FAULTLINE_API_TOKENS (scopes ingest+read)."""

    def headers(self) -> dict[str, str]:
        """What every request carries."""
        headers = {"User-Agent": "faultline-sidecar/1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def __post_init__(self) -> None:
        if not self.server.startswith(("http://", "https://")):
            raise ValueError(f"--server must be an http(s) URL, got {self.server!r}")
        if not self.paths and not self.command:
            raise ValueError("give at least one PATH to follow, or a command after --")
        if self.buffer_bytes < self.tail.batch_bytes:
            raise ValueError(f"--buffer-bytes ({self.buffer_bytes}) must hold at least one batch "
                             f"({self.tail.batch_bytes})")
