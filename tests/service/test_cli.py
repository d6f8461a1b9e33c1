"""The `faultline` command end to end, as a subprocess, as a user runs it."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.test_http import LOG, ROOT_LINE
from tests.support.databases import cli_env
from tests.support.torchrun import EXCEPTION, failing_torchrun, without_the_box

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_KEYS = {"status", "root_cause", "other_errors", "action", "suspect_nodes", "mitigation", "progress",
                 "compression", "suggested_rules"}


def faultline(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **cli_env(Path(os.environ["FAULTLINE_DATA_DIR"])), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], input=stdin, capture_output=True,
                          env=env, cwd=ROOT, timeout=300, check=False)


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.log"
    path.write_text(LOG)
    return path


def test_diagnose_json_follows_the_contract(log_file: Path) -> None:
    proc = faultline("diagnose", str(log_file), "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert CONTRACT_KEYS <= body.keys()
    assert body["root_cause"]["line"] == ROOT_LINE and body["root_cause"]["file"] == str(log_file)
    assert set(body["compression"]) >= {"lines_in", "lines_kept", "bytes_in"}
    assert proc.stderr == b""  # piped output stays clean: no progress line


def test_human_output_names_the_line(log_file: Path) -> None:
    proc = faultline("diagnose", str(log_file))
    assert proc.returncode == 0
    assert ROOT_LINE in proc.stdout.decode() and "status: failed" in proc.stdout.decode()


def test_each_gives_one_object_per_path_in_order(tmp_path: Path, log_file: Path) -> None:
    healthy = tmp_path / "healthy.log.gz"
    healthy.write_bytes(gzip.compress(b"".join(line.encode() + b"\n" for line in LOG.splitlines()[:3])))
    proc = faultline("diagnose", "--each", str(healthy), str(log_file), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["path"] for r in rows] == [str(healthy), str(log_file)]
    assert rows[0]["root_cause"] is None and rows[0]["status"] in ("running", "healthy")
    assert rows[1]["root_cause"]["line"] == ROOT_LINE


def test_stdin_and_several_files_of_one_job(tmp_path: Path) -> None:
    proc = faultline("diagnose", "-", "--json", stdin=LOG.encode())
    assert proc.returncode == 0 and json.loads(proc.stdout)["root_cause"]["file"] == "<stdin>"
    lines = LOG.splitlines()
    (tmp_path / "node-0.log").write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "node-1.log").write_text("\n".join(lines[3:]) + "\n")
    proc = faultline("diagnose", str(tmp_path / "node-0.log"), str(tmp_path / "node-1.log"), "--json")
    body = json.loads(proc.stdout)
    assert body["root_cause"]["file"].endswith("node-1.log") and body["root_cause"]["line_number"] == 6
    assert body["compression"]["lines_in"] == len(lines)


def test_compress_json_reports_what_it_kept(log_file: Path) -> None:
    proc = faultline("compress", str(log_file), "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert {"lines_in", "lines_kept", "bytes_in", "rules_learned", "kept"} <= body.keys()
    assert body["lines_in"] == 10 and len(body["kept"]) == body["lines_kept"]
    assert ROOT_LINE in body["kept"]


@pytest.mark.parametrize(("args", "message"), [
    (["diagnose", "/no/such/file.log"], "cannot read /no/such/file.log"),
    (["diagnose"], "required"),
    (["diagnose", "--each", "x.log"], "--each needs --json"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_usage_exits_2_with_one_line(args: list[str], message: str) -> None:
    proc = faultline(*args)
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert message in err and err.count("\n") == 1


def test_empty_and_directory_inputs_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert faultline("diagnose", str(empty)).returncode == 2
    assert faultline("diagnose", str(tmp_path)).returncode == 2


def test_diagnose_says_on_stderr_what_it_stored_and_where(tmp_path) -> None:
    import subprocess
    import sys as _sys
    from pathlib import Path as _Path

    root = _Path(__file__).resolve().parents[2]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATA_DIR=str(tmp_path / "data"), FAULTLINE_FAILURE_AGENT="false")
    log = root / "fixtures/logs/cases/megatron/ecc_error.log"
    done = subprocess.run([_sys.executable, "-m", "service.cli", "diagnose", "--job-name", "gpt-7b-pretrain", str(log)],
                          capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("faultline: ")]
    assert "filter rule" in line and "family:gpt-7b-pretrain" in line and str(tmp_path / "data") in line


def test_no_learn_stores_nothing_and_gives_the_same_answer_twice(tmp_path) -> None:
    """`--no-learn`: what the Log Agent learns stays in the run (it still compresses with it),
    nothing lands in the store, so a second run gives the same JSON."""
    import sqlite3

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATA_DIR=str(tmp_path / "data"), FAULTLINE_FAILURE_AGENT="false")
    log = root / "fixtures/logs/cases/megatron/ecc_error.log"

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "service.cli", *args, str(log)], capture_output=True, text=True,
                              cwd=root, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    first = run("diagnose", "--json", "--no-learn", "--job-name", "gpt-7b-pretrain")
    second = run("diagnose", "--json", "--no-learn", "--job-name", "gpt-7b-pretrain")
    compressed = run("compress", "--json", "--no-learn", "--job-name", "gpt-7b-pretrain")
    assert "stored in" not in first.stderr + second.stderr + compressed.stderr
    assert json.loads(compressed.stdout)["learned"]  # learned, used in the run, not kept
    with sqlite3.connect(tmp_path / "data" / "faultline.db") as db:
        assert db.execute("select count(*) from rules").fetchone() == (0,)
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["root_cause"] == b["root_cause"] and a["suspect_nodes"] == b["suspect_nodes"] == ["node-027"]
    assert a["compression"] == b["compression"] and a["action"] == b["action"]


def test_version_and_usage_hints_name_real_commands() -> None:
    done = faultline("--version")
    assert done.returncode == 0 and done.stdout.decode().startswith("faultline ")
    assert "(see faultline --help)" in faultline().stderr.decode()
    assert "(see faultline rules approve --help)" in faultline("rules", "approve").stderr.decode()
    assert "(see faultline diagnose --help)" in faultline("diagnose").stderr.decode()


def test_each_reports_a_bad_file_and_goes_on(tmp_path: Path, log_file: Path) -> None:
    binary = tmp_path / "core.log"
    binary.write_bytes(b"\x00\x01\x02 not text\n")
    done = faultline("diagnose", "--each", "--json", str(binary), str(log_file), str(tmp_path / "missing.log"))
    assert done.returncode == 2  # one failed, and it says which
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["path"] for r in rows] == [str(binary), str(log_file), str(tmp_path / "missing.log")]
    assert "binary" in rows[0]["error"] and str(binary) in rows[0]["error"]
    assert rows[1]["root_cause"]["line"] == ROOT_LINE
    assert "missing.log" in rows[2]["error"]


def test_a_gzip_error_names_its_file(tmp_path: Path, log_file: Path) -> None:
    """Of several files given, the message says which one is broken."""
    import gzip

    cut = tmp_path / "rank3.log.gz"
    cut.write_bytes(gzip.compress(b"".join(b"step %d loss %d\n" % (i, i * 7919 % 1000) for i in range(5000)))[:200])
    done = faultline("diagnose", str(log_file), str(cut))
    assert done.returncode == 2
    assert f"{cut}: truncated gzip data" in done.stderr.decode()


def _error_file(folder: Path, local_rank: int, exc: str, frames: str) -> Path:
    path = folder / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True)
    # the shape torch writes (elastic/multiprocessing/errors/error_handler.py record_exception)
    path.write_text(json.dumps({"message": {"message": exc, "extraInfo": {
        "py_callstack": f"Traceback (most recent call last):\n{frames}{exc}\n", "timestamp": "1732400000"}}}))
    return path


def test_torchrun_error_files_are_evidence(tmp_path: Path) -> None:
    """The log has only torchrun's summary (`error_file:` names the file); the rank's recorded
    traceback in its error file names the cause."""
    log = tmp_path / "job.log"
    log.write_text("E1128 21:12:50.390000 3139541 torch/distributed/elastic/multiprocessing/api.py:874] failed "
                   "(exitcode: 1) local_rank: 3 (pid: 3139623) of binary: /usr/bin/python3\n")
    exc = "ValueError: micro batch size 3 does not divide global batch size 128"
    _error_file(tmp_path / "torchelastic_x", 3, exc, '  File "/workspace/train.py", line 40, in <module>\n    check()\n')
    done = faultline("diagnose", "--json", str(log), "--error-file", str(tmp_path / "torchelastic_*" / "**" / "error.json"))
    assert done.returncode == 0, done.stderr
    root = json.loads(done.stdout)["root_cause"]
    assert root["reason"] == "value_error" and root["line"] == f"[default3]:{exc}"
    assert root["file"].endswith("attempt_0/3/error.json")


def test_error_files_torchrun_wrote_name_the_cause_the_console_lost(tmp_path: Path) -> None:
    """A real torchrun on the CPU: two workers, local rank 1 raises under `@record`, their
    output goes to files. The job's log lost the launcher's box; the error file torchrun kept
    names the cause."""
    console, logs = failing_torchrun(tmp_path)
    kept = without_the_box(console)
    assert "failed (exitcode: 1) local_rank: 1" in kept and "micro batch size" not in kept
    log = tmp_path / "job.log"
    log.write_text(kept)
    done = faultline("diagnose", "--json", str(log), "--error-file", str(logs / "**" / "error.json"))
    assert done.returncode == 0, done.stderr
    root = json.loads(done.stdout)["root_cause"]
    assert root["reason"] == "value_error"
    assert root["line"] == f"[default1]:{EXCEPTION}"
    assert root["file"].endswith("attempt_0/1/error.json")
    # without it, the same log only says a worker failed, and where torchrun kept its exception
    alone = json.loads(faultline("diagnose", "--json", str(log)).stdout)
    assert alone["status"] == "failed" and alone["root_cause"]["reason"] == "unknown"
    assert "failed (exitcode: 1) local_rank: 1" in alone["root_cause"]["line"]
    kept_at = root["file"]
    assert f"--error-file {kept_at}" in alone["mitigation"]


@pytest.mark.parametrize(("content", "message"), [
    (b"not json", "not a torchrun error file"),
    (b'{"other": 1}', "not a torchrun error file"),
    (b'{"message": {"message": "", "extraInfo": {}}}', "records no exception"),
])
def test_a_bad_error_file_is_refused_by_name(tmp_path: Path, log_file: Path, content: bytes, message: str) -> None:
    bad = tmp_path / "error.json"
    bad.write_bytes(content)
    done = faultline("diagnose", str(log_file), "--error-file", str(bad))
    assert done.returncode == 2 and message in done.stderr.decode() and str(bad) in done.stderr.decode()
    assert "no file matches" in faultline("diagnose", str(log_file), "--error-file", str(tmp_path / "x*.json")).stderr.decode()


def test_every_command_explains_every_option_and_shows_examples() -> None:
    from service.cli import _parser

    commands = _parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them there
    assert {"diagnose", "serve", "compress", "eval", "db", "tail"} <= set(commands)
    verbs = commands["rules"]._subparsers._group_actions[0].choices  # noqa: SLF001
    for name, command in [*commands.items(), *((f"rules {v}", c) for v, c in verbs.items())]:
        assert command.description and "examples:" in (command.epilog or ""), name
        undocumented = [a.dest for a in command._actions if not a.help]  # noqa: SLF001
        assert not undocumented, (name, undocumented)
