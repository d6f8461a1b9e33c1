"""Context is never filtered: whatever the filter rules (built-in, and what the Log Agent
learns on the log itself), a traceback frame's source line and the torchrun failure box's
fields stay in the kept lines, on every generated case and every real log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents.log_agent import LogAgent, LogAgentConfig
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook

ROOT = Path(__file__).resolve().parents[2]
LOGS = sorted([*(ROOT / "fixtures/logs/cases").glob("*/*.log"), *(ROOT / "fixtures/real").glob("*/*.log")])
FRAME = re.compile(r'File "[^"]+", line \d+')
BOX = re.compile(r"^\W*(?:\[\w+\]:)?\s*(?:host|rank|exitcode|error_file|traceback|time) +: ")


@pytest.fixture(scope="module")
def agent() -> LogAgent:
    return LogAgent(LogAgentConfig(), corpus=[])


@pytest.mark.parametrize("path", LOGS, ids=[str(p.relative_to(ROOT / "fixtures")) for p in LOGS])
def test_frames_their_source_lines_and_box_fields_are_kept(path: Path, builtin_rulebook: Rulebook,
                                                           agent: LogAgent) -> None:
    meta = JobMeta(name="context-check", framework=None)
    run = JobRun(builtin_rulebook, meta, log_agent=agent.for_job(meta))
    data = path.read_bytes()
    kept: set[int] = set()
    # fed in a few buffers, so rules learned on the first ones apply to the rest
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i in range(0, len(lines), 200):
        kept |= {k.line_number for k in run.feed("job.log", b"\n".join(lines[i:i + 200]) + b"\n")}
    text = [line.decode("utf-8", "replace") for line in lines]
    must = set()
    for n, line in enumerate(text, 1):
        if FRAME.search(line) and n < len(text):
            must |= {n, n + 1}
        if BOX.match(line):
            must.add(n)
    assert must - kept == set(), [text[n - 1] for n in sorted(must - kept)][:5]
