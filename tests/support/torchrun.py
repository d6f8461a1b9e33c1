"""A real torchrun on the CPU whose local rank 1 raises under `@record`: the console and the
error file it keeps are what a failed job of ours leaves, made here rather than copied."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FAILING_WORKER = '''\
import os
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["LOCAL_RANK"] == "1":
        raise ValueError("micro batch size 3 does not divide global batch size 128")


main()
'''
EXCEPTION = "ValueError: micro batch size 3 does not divide global batch size 128"


def failing_torchrun(folder: Path) -> tuple[str, Path]:
    """Runs two workers with their output redirected to files (`--redirects 3`); returns the
    console (torchrun's own lines and its failure box) and the log folder holding
    `<run>/attempt_0/1/error.json`."""
    script = folder / "train.py"
    script.write_text(FAILING_WORKER)
    logs = folder / "elastic"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--redirects", "3", "--log-dir", str(logs), str(script)],
                         capture_output=True, text=True, cwd=folder, timeout=120, check=False)
    assert run.returncode == 1, run.stderr
    return run.stdout + run.stderr, logs


def without_the_box(console: str) -> str:
    """What a log keeps of the console when it lost the launcher's own traceback and box (a
    shipper that cut it, a `tail` of the agent's log): `failed (exitcode: 1)` and no cause."""
    return console[:console.index("Traceback (most recent call last):")]
