"""Fluent Bit and Vector feeding a live job through POST /ingest/records, configured as in
examples/: a growing file that is rotated mid-job arrives exactly once, through retried
requests, a batch sent before the one it follows, and gzip; on a real server on loopback.

Neither shipper can be installed here (no Debian package, no PyPI wheel), so a small tailer
plays each one, speaking its HTTP format as its source code does: Fluent Bit's tail input
gives each line's start offset under Offset_Key and the path under Path_Key (plugins/in_tail/
tail_file.c), its http output sends `json_lines` with a `date`; Vector's file source gives
`file`, `message` and the line's start offset under offset_key (src/sources/file.rs), its
http sink newline-delimited JSON. Both retry 5xx, 408 and 429 and drop a batch on another 4xx
(Fluent Bit's plugins/out_http/http.c, Vector's src/sinks/util/http.rs)."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from service.ingest import records
from service.ingest.records import Batch
from service.live.shipped import GAP_SLACK, FileState, file_id, place
from service.live.ledger import checksum
from service.settings import Settings
from tests.support.server import running_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = {"SLURM_JOB_ID": "771204", "TRAIN_JOB_NAME": "gpt-13b-sft", "INGEST_TOKEN": "",
       "TRAIN_LOG_GLOB": "/var/log/train/*.log"}


def fluent_bit_config() -> dict[str, dict[str, str]]:
    """examples/fluent-bit/fluent-bit.conf in Fluent Bit's classic format: [SECTION], then
    `Key value` lines (keys are case-insensitive)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for raw in (EXAMPLES / "fluent-bit" / "fluent-bit.conf").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]").upper(), {})
            continue
        key, _, value = line.partition(" ")
        assert current is not None, raw
        current[key.lower()] = value.strip()
    return sections


def vector_config() -> dict:
    return yaml.safe_load((EXAMPLES / "vector" / "vector.yaml").read_text())


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)


def test_the_fluent_bit_example_sends_what_the_endpoint_needs() -> None:
    config = fluent_bit_config()
    tail, http = config["INPUT"], config["OUTPUT"]
    assert (tail["name"], http["name"]) == ("tail", "http")
    assert tail["path_key"] in records.FILE_FIELDS and tail["offset_key"] == records.OFFSET_FIELD
    assert tail["db"]  # offsets kept across a restart of Fluent Bit
    assert http["format"] == "json_lines" and http["retry_limit"] == "no_limits"
    assert http["match"] == tail["tag"]
    uri = urlsplit(expand(http["uri"], ENV))
    assert uri.path == "/ingest/records" and parse_qs(uri.query)["job_key"] == ["771204"]
    assert http["header"].startswith("Authorization Bearer ")


def test_the_vector_example_sends_what_the_endpoint_needs() -> None:
    config = vector_config()
    (source_name, source), = config["sources"].items()
    sink = config["sinks"]["faultline"]
    assert source["type"] == "file" and source["offset_key"] == records.OFFSET_FIELD
    assert config["data_dir"]  # checkpoints kept across a restart of Vector
    assert sink["type"] == "http" and sink["inputs"] == [source_name]
    assert sink["encoding"]["codec"] == "json" and sink["framing"]["method"] == "newline_delimited"
    assert sink["auth"]["strategy"] == "bearer"
    uri = urlsplit(expand(sink["uri"], {**ENV, "SERVICE_HOST": "h", "SERVICE_PORT": "1"}))
    assert uri.path == "/ingest/records" and parse_qs(uri.query)["job_key"] == ["771204"]


class Tailer:
    """One shipper's tail of one path: each poll reads the whole lines added since the last
    one, as records with the line's start offset; a new inode (rotation) starts at 0."""

    def __init__(self, path: Path, record_of):
        self.path, self.record_of = path, record_of
        self.inode, self.offset = None, 0

    def poll(self) -> list[dict]:
        stat = self.path.stat()
        if stat.st_ino != self.inode:
            self.inode, self.offset = stat.st_ino, 0
        data = self.path.read_bytes()[self.offset:]
        out = []
        for line in data.split(b"\n")[:-1]:
            out.append(self.record_of(str(self.path), self.offset, line.decode()))
            self.offset += len(line) + 1
        return out


def fluent_bit_record(tail: dict[str, str]):
    return lambda path, offset, text: {"date": 1764000000.25, "log": text, tail["path_key"]: path,
                                       tail["offset_key"]: offset}


def vector_record(source: dict):
    return lambda path, offset, text: {"file": path, "host": "node-3", "message": text,
                                       source["offset_key"]: offset, "source_type": "file",
                                       "timestamp": "2026-11-25T10:00:00.25Z"}


def send(url: str, job_params: dict, batch: list[dict], *, compress: bool) -> httpx.Response:
    body = "\n".join(json.dumps(r) for r in batch).encode()
    headers = {"Content-Type": "application/x-ndjson"}
    if compress:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    return httpx.post(f"{url}/ingest/records", params=job_params, content=body, headers=headers, timeout=60)


def deliver(url: str, job_params: dict, batch: list[dict], *, compress: bool) -> dict:
    """Send until accepted, as both shippers do with 5xx answers."""
    for _ in range(50):
        r = send(url, job_params, batch, compress=compress)
        if r.status_code == 200:
            return r.json()
        assert r.status_code == 503, r.text
    raise AssertionError("never accepted")


TRAINING = [f"[rank0] iteration {i:6d}/ 100000 | lm loss: {3.2 - i * 0.0004:.6E} | grad norm: 0.41 |"
            for i in range(1, 1201)]
FAILURE = ["[rank0] Traceback (most recent call last):",
           '[rank0]   File "pretrain_gpt.py", line 88, in forward_step',
           "[rank0] RuntimeError: CUDA error: an illegal memory access was encountered"]


@pytest.mark.parametrize("shipper", ["fluent-bit", "vector"])
def test_a_growing_rotated_file_arrives_exactly_once(tmp_path: Path, shipper: str) -> None:
    if shipper == "fluent-bit":
        tail, http = fluent_bit_config()["INPUT"], fluent_bit_config()["OUTPUT"]
        record_of, compress = fluent_bit_record(tail), http["compress"] == "gzip"
        query = parse_qs(urlsplit(expand(http["uri"], ENV)).query)
    else:
        config = vector_config()
        record_of = vector_record(next(iter(config["sources"].values())))
        compress = config["sinks"]["faultline"]["compression"] == "gzip"
        query = parse_qs(urlsplit(expand(config["sinks"]["faultline"]["uri"],
                                         {**ENV, "SERVICE_HOST": "h", "SERVICE_PORT": "1"})).query)
    params = {key: values[0] for key, values in query.items()}
    log = tmp_path / "rank0.log"
    written: list[list[str]] = [[]]
    tailer = Tailer(log, record_of)
    with running_server(Settings(data_dir=tmp_path / "data", admin_enabled=False)) as url:
        batches = []
        for start in range(0, len(TRAINING), 100):
            with log.open("a") as f:
                f.writelines(line + "\n" for line in TRAINING[start:start + 100])
            written[-1].extend(TRAINING[start:start + 100])
            batches.append(tailer.poll())
            if start == 600:  # rotated, as logrotate's create mode does, after the shipper read it all
                log.rename(tmp_path / "rank0.log.1")
                log.touch()
                written.append([])
        with log.open("a") as f:
            f.writelines(line + "\n" for line in FAILURE)
        written[-1].extend(FAILURE)
        batches.append(tailer.poll())

        job = deliver(url, params, batches[0], compress=compress)["job_id"]
        deliver(url, params, batches[1], compress=compress)
        again = deliver(url, params, batches[1], compress=compress)  # its answer was lost: sent again
        assert again["lines"] == 0 and again["files"][0]["duplicate"]
        # a batch sent while the one before it still waits for its retry: held with a 503
        early = send(url, params, batches[3], compress=compress)
        assert early.status_code == 503 and "waiting for the records" in early.json()["error"]
        assert early.headers["Retry-After"]
        for batch in batches[2:]:
            deliver(url, params, batch, compress=compress)
        # a replay cut into other batches (a restarted shipper that lost its last checkpoint)
        replay = [r for batch in batches[8:10] for r in batch]
        assert deliver(url, params, replay[50:], compress=compress)["lines"] == 0

        sources = httpx.get(f"{url}/jobs/{job}/sources", timeout=10).json()["data"]
        assert [s["file"] for s in sources] == [file_id(0), file_id(1)]
        for stored, lines in zip(sources, written, strict=True):
            content = "".join(line + "\n" for line in lines).encode()
            assert (stored["lines"], stored["bytes"]) == (len(lines), len(content))
            assert stored["crc32"] == f"{zlib.crc32(content):08x}"  # every byte once, in order
        finished = httpx.post(f"{url}/jobs/{job}/finish", json={"exit_code": 1}, timeout=60).json()
        assert finished["lines_received"] == sum(map(len, written))
        assert finished["external_id"] == ENV["SLURM_JOB_ID"] and finished["name"] == ENV["TRAIN_JOB_NAME"]
        root = finished["diagnosis"]["root_cause"]
        assert root["reason"] == "cuda_error" and root["line"] == FAILURE[-1]


def test_records_without_what_exactly_once_needs_are_refused_whole(tmp_path: Path) -> None:
    """A 4xx makes both shippers drop the batch, so it comes only when the config, not the
    moment, is wrong; it names the missing key, and nothing of the request is stored."""
    with running_server(Settings(data_dir=tmp_path, admin_enabled=False)) as url:
        good = {"log": "step 1", "filename": "/l/rank0.log", "offset": 0}
        cases = {
            "Offset_Key": [good, {"log": "step 2", "filename": "/l/rank0.log"}],
            "Path_Key": [{"log": "step 1", "offset": 0}],
            "no line text": [{"filename": "/l/rank0.log", "offset": 0, "msg": "step 1"}],
        }
        for needle, batch in cases.items():
            r = send(url, {"job_key": "k-1"}, batch, compress=False)
            assert r.status_code == 400 and needle in r.json()["error"], r.text
        r = httpx.post(f"{url}/ingest/records", params={"job_key": "k-1"}, content=b"{not json", timeout=10)
        assert r.status_code == 400 and "not JSON records" in r.json()["error"]
        jobs = httpx.get(f"{url}/jobs", params={"external_id": "k-1"}, timeout=10).json()
        assert jobs["count"] == 0
        # a JSON array (Fluent Bit's `Format json`) is read too
        r = httpx.post(f"{url}/ingest/records", params={"job_key": "k-1"}, content=json.dumps([good]), timeout=10)
        assert r.status_code == 200 and r.json()["lines"] == 1


def test_an_api_token_is_needed_when_tokens_are_configured(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, admin_enabled=False, api_tokens="node:ingest:shp-4c1d9e7a2b5f8036")
    with running_server(settings) as url:
        batch = [{"log": "step 1", "filename": "/l/rank0.log", "offset": 0}]
        assert send(url, {"job_key": "k"}, batch, compress=False).status_code == 401
        r = httpx.post(f"{url}/ingest/records", params={"job_key": "k"}, content=json.dumps(batch),
                       headers={"Authorization": "Bearer shp-4c1d9e7a2b5f8036"}, timeout=10)
        assert r.status_code == 200, r.text


# -- the placement rules alone ---------------------------------------------------------------

def batch(*lines: tuple[int, str]) -> Batch:
    return Batch("/l/rank0.log", tuple(o for o, _ in lines), tuple(t.encode() for _, t in lines))


def state(next_offset: int | None, idle_s: float = 0.0, generation: int = 0) -> FileState:
    return FileState(file_id(generation), next_offset, idle_s, generation)


def test_placement_follows_on_skips_what_is_held_and_waits_for_a_missing_batch() -> None:
    b = batch((100, "step 9"), (107, "step 10"))
    placed, physical = place(b, state(None), None)  # the file's first batch may start anywhere
    assert (placed.chunk.offset, placed.chunk.end, physical) == (100, 115, file_id(0))
    placed, _ = place(b, state(115), (15, checksum(b.body)))
    assert placed.chunk is None and placed.wait_for is None  # a retry
    placed, _ = place(b, state(107), None)  # half held already: the rest follows on
    assert placed.lines.texts == (b"step 10",) and (placed.chunk.offset, placed.chunk.end) == (107, 115)
    placed, _ = place(b, state(99), None)  # a CR the shipper dropped: still follows on
    assert placed.chunk.offset == 99
    far = batch((100 + GAP_SLACK + 1, "step 99"))
    assert place(far, state(100), None)[0].wait_for == 100
    placed, _ = place(far, state(100, idle_s=31.0), None)  # the batch in between never came
    assert placed.chunk.offset == 100 and placed.lines.texts == (b"step 99",)


def test_a_file_that_starts_again_at_zero_is_the_next_file_unless_it_is_a_retry() -> None:
    first = batch((0, "start"), (6, "step 1"))
    placed, physical = place(first, state(5000, generation=2), None)
    assert physical == file_id(3) and placed.chunk.file_id == file_id(3) and placed.chunk.offset == 0
    placed, physical = place(first, state(5000, generation=2), (13, checksum(first.body)))
    assert placed.chunk is None and physical == file_id(2)


def test_records_of_several_files_become_one_batch_each_in_offset_order() -> None:
    body = "\n".join(json.dumps(r) for r in [
        {"log": "b", "filename": "/l/1.log", "offset": 2}, {"message": "x", "file": "/l/2.log", "offset": 0},
        {"log": "a", "filename": "/l/1.log", "offset": 0}, {"log": "a", "filename": "/l/1.log", "offset": 0}])
    got = records.parse(body.encode(), max_records=10)
    assert [(b.source, b.offsets, b.texts) for b in got] == [("/l/1.log", (0, 2), (b"a", b"b")),
                                                             ("/l/2.log", (0,), (b"x",))]
    with pytest.raises(Exception, match="more than 3"):
        records.parse(body.encode(), max_records=3)


def test_environment_in_examples_is_documented() -> None:
    # every ${VAR} the two examples use is named in examples/README.md
    readme = (EXAMPLES / "README.md").read_text()
    settings = [line for name in ("fluent-bit/fluent-bit.conf", "vector/vector.yaml")
                for line in (EXAMPLES / name).read_text().splitlines() if not line.lstrip().startswith("#")]
    used = set(re.findall(r"\$\{(\w+)\}", "\n".join(settings)))
    assert used and all(name in readme for name in used), used - {n for n in used if n in readme}
