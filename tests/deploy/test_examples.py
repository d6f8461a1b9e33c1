"""The deployment examples agree with the code: every `faultline` command in them parses with
the real CLI, the Slurm batch script and epilog name the same log and job key (so the epilog
resumes the sidecar's files), the Kubernetes sidecar follows a volume the trainer writes, and
the Slurm webhook receiver accepts the service's signed notifications and drains the right
nodes (run for real on loopback, without --apply)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from service.cli import _parser, split_command
from service.store.models import Job
from service.live.notify import payload, sign, standard_headers
from service.settings import Settings
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SLURM_ENV = {"SLURM_JOB_ID": "494583", "SLURM_JOB_NAME": "gpt-7b-pretrain", "SLURM_NNODES": "4",
             "SLURM_JOB_NODELIST": "lrdn[3321-3324]", "status": "137", "MASTER_ADDR": "lrdn3321"}
_SHELL_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def expand(text: str, env: dict[str, str]) -> str:
    """Shell variables as the script would see them (defaults for the unset ones)."""
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        return env.get(name, match.group(2) if match.group(2) is not None else f"<{name}>")
    return _SHELL_VAR.sub(one, text)


def shell_commands(path: Path, env: dict[str, str]) -> list[list[str]]:
    """Every `faultline` invocation of a shell script, line continuations joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env = {**env, **{m.group(1): expand(m.group(2), env) for m in re.finditer(r"^(\w+)=(\S+)", text, re.M)}}
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not re.search(r"(^|[\s/])faultline tail", line):
            continue
        words = shlex.split(expand(line, env))
        start = next(i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] == "faultline")
        words = words[start + 1:]
        end = next((i for i, w in enumerate(words) if w in ("||", "&&", "|", ";")), len(words))
        found.append(words[:end])
    return found


def parse(argv: list[str]):
    args, command = split_command(argv)
    namespace = _parser().parse_args(args)
    namespace.command_argv = command
    return namespace


def test_every_faultline_command_in_the_examples_parses() -> None:
    commands = [c for script in (EXAMPLES / "slurm").glob("*.s*") for c in shell_commands(script, SLURM_ENV)]
    assert len(commands) == 2
    for argv in commands:
        args = parse(argv)
        assert args.command == "tail" and args.server.startswith("http") and args.job_name


def test_the_batch_script_runs_the_training_under_the_sidecar() -> None:
    [argv] = shell_commands(EXAMPLES / "slurm" / "train.sbatch", SLURM_ENV)
    args = parse(argv)
    assert args.command_argv[:1] == ["srun"] and "torchrun" in args.command_argv
    assert "--tee" in args.command_argv, "torchrun --tee 3 puts every rank's lines on the sidecar's pipe"
    assert args.job_key == "slurm-494583" and args.tee == "/shared/train-logs/494583/launcher.log"


def test_the_epilog_resumes_the_sidecars_file_and_reports_a_shell_exit_status() -> None:
    [batch] = shell_commands(EXAMPLES / "slurm" / "train.sbatch", SLURM_ENV)
    [epilog] = shell_commands(EXAMPLES / "slurm" / "faultline-epilog.sh", SLURM_ENV)
    sidecar, after = parse(batch), parse(epilog)
    assert after.once and after.exit_code == 137
    assert after.paths == [sidecar.tee], "the same source name: the service knows where the file stopped"
    assert after.job_key == sidecar.job_key and after.job_name == sidecar.job_name
    # the exit status arithmetic of the script itself, run by bash
    script = (EXAMPLES / "slurm" / "faultline-epilog.sh").read_text()
    snippet = script[script.index("IFS=:"):script.index("export FAULTLINE_DATA_DIR")] + 'echo "$status"\n'
    for exit2, expected in (("0:9", "137"), ("3:0", "3"), ("0:0", "0")):
        out = subprocess.run(["bash", "-c", snippet], env={"SLURM_JOB_EXIT_CODE2": exit2}, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == expected


def test_the_kubernetes_sidecar_follows_what_the_trainer_writes() -> None:
    job = yaml.safe_load((EXAMPLES / "kubernetes" / "training-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    [sidecar] = [c for c in pod["initContainers"] if c["command"][0] == "faultline"]
    assert sidecar["restartPolicy"] == "Always", "a native sidecar: started first, stopped after the trainer"
    env = {e["name"]: "x" for e in sidecar.get("env", [])}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in sidecar["command"][1:] + sidecar["args"]]
    args = parse(argv)
    assert args.finish_on_stop and args.exit_code_file
    mounts = {m["mountPath"] for m in sidecar["volumeMounts"]}
    trainer = pod["containers"][0]
    shared = mounts & {m["mountPath"] for m in trainer["volumeMounts"]}
    assert shared == {"/logs"}
    assert all(p.startswith("/logs/") for p in [*args.paths, args.exit_code_file, args.state_dir])
    script = trainer["args"][0]
    assert "tee /logs/train.log" in script and f"> {args.exit_code_file}" in script


def test_faultline_settings_named_in_the_examples_exist() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    for path in EXAMPLES.rglob("*"):
        if path.is_file():
            for name in re.findall(r"FAULTLINE_(\w+)", path.read_text()):
                assert name in fields, f"{path.name}: FAULTLINE_{name} is read by nothing"


@pytest.fixture
def hook() -> str:
    port = free_port()
    env = {**os.environ, "FAULTLINE_WEBHOOK_SECRET": "whsec-slurm-hook-test-1"}
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "slurm" / "faultline_hook.py"), "--host", "127.0.0.1",
                             "--port", str(port), "--max-drains-per-hour", "2"], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().startswith("listening")
    yield f"http://127.0.0.1:{port}/", proc
    proc.terminate()
    proc.communicate(timeout=30)


SECRET = b"whsec-slurm-hook-test-1"


def _ecc(external_id: str, nodes: list[str], *, final: bool) -> bytes:
    job = Job(id="4f1c", name="gpt-7b-pretrain", external_id=external_id, exit_code=1 if final else None,
              lines_received=120_000)
    diagnosis = {"status": "failed", "action": "cordon_and_restart", "suspect_nodes": nodes,
                 "root_cause": {"reason": "ecc_error", "category": "infrastructure", "origin": "infrastructure",
                                "line": "CUDA error: uncorrectable ECC error encountered"}, "mitigation": ""}
    return json.dumps(payload(job, diagnosis, "failed", final=final)).encode()


def test_the_slurm_hook_drains_the_suspect_nodes_of_an_ended_job_and_requeues(hook) -> None:
    url, proc = hook
    body = _ecc("slurm-494583", ["lrdn3321", "x;reboot"], final=True)
    assert httpx.post(url, content=body, headers=standard_headers(b"wrong", "faultline-17", body)).status_code == 401
    old = datetime.now(UTC) - timedelta(minutes=10)  # a captured delivery, replayed later
    assert httpx.post(url, content=body, headers=standard_headers(SECRET, "faultline-16", body, old)).status_code == 401
    # the service's older header alone is not enough: it has no time to refuse a replay by
    assert httpx.post(url, content=body, headers={"X-Faultline-Signature": sign(SECRET, body)}).status_code == 401
    headers = standard_headers(SECRET, "faultline-17", body)
    assert httpx.post(url, content=body, headers=headers).status_code == 200
    assert httpx.post(url, content=body, headers=headers).status_code == 200, "a repeat is acknowledged"
    lines = [proc.stdout.readline().strip() for _ in range(3)]
    assert lines == ["would run: scontrol update NodeName=lrdn3321 State=DRAIN "
                     "Reason=faultline: ecc_error (job 494583)",
                     "would run: scontrol requeue 494583",
                     "skipped: drain of 'x;reboot': not a plain host name"]
    proc.terminate()
    rest, _ = proc.communicate(timeout=30)
    assert "scontrol" not in rest, "the repeated delivery did nothing"


def test_the_slurm_hook_drains_nothing_under_a_running_job_and_at_most_its_budget(hook) -> None:
    url, proc = hook

    def post(body: bytes, delivery: str) -> None:
        assert httpx.post(url, content=body, headers=standard_headers(SECRET, delivery, body)).status_code == 200

    post(_ecc("slurm-700", ["gpu-001"], final=False), "faultline-1")
    assert proc.stdout.readline().strip() == ("skipped: drain of gpu-001 and requeue of job 700: the job is still "
                                              "running; waiting for its final diagnosis")
    post(_ecc("slurm-700", ["gpu-001", "gpu-002"], final=True), "faultline-2")
    post(_ecc("slurm-701", ["gpu-003", "gpu-001"], final=True), "faultline-3")
    lines = [proc.stdout.readline().strip() for _ in range(6)]
    assert lines == [
        "would run: scontrol update NodeName=gpu-001 State=DRAIN Reason=faultline: ecc_error (job 700)",
        "would run: scontrol update NodeName=gpu-002 State=DRAIN Reason=faultline: ecc_error (job 700)",
        "would run: scontrol requeue 700",
        "would run: scontrol requeue 701",
        "skipped: drain of gpu-003: 2 nodes drained in the last hour (--max-drains-per-hour 2)",
        lines[5],
    ]
    assert lines[5].startswith("skipped: drain of gpu-001: gpu-001 was drained by this hook ")
