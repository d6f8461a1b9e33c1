"""The operator's log: one key=value line per diagnosis, whatever the way in, with no text of
the log itself in it (a log line may hold anything)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rules.job import JobMeta
from service.context import Context
from service.ingest.sources import feed_path
from service.settings import Settings

CASE = Path(__file__).resolve().parents[2] / "fixtures/logs/cases/megatron/ecc_error.log"


def test_a_diagnosis_writes_one_line_naming_job_status_reason_and_action(tmp_path: Path, minilm,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    with Context.open(Settings(data_dir=tmp_path), embedder=minilm) as ctx:
        run = ctx.new_run(JobMeta(name="gpt-7b pretrain"))
        feed_path(run, str(CASE))
        diagnosis = run.finish()
        with caplog.at_level(logging.INFO, logger="faultline.diagnosis"):
            ctx.after_run(run, diagnosis, entry="diagnose", job_id="j-123")
    lines = [r.getMessage() for r in caplog.records if r.name == "faultline.diagnosis"]
    assert len(lines) == 1
    line = lines[0]
    assert 'entry=diagnose job=j-123 name="gpt-7b pretrain" status=failed reason=ecc_error' in line
    assert f"action={diagnosis.action}" in line and "lines=" in line
    assert float(line.rsplit("seconds=", 1)[1]) >= 0  # from the run's creation to its diagnosis
    assert diagnosis.root_cause.line not in line
