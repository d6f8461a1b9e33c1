"""The file-following half of the sidecar: whole lines out, contiguous byte ranges, rotation,
truncation, fingerprints, partial and over-long lines, read-from-end, resuming after a restart.
Real files in a temp directory; a hand-moved clock for the timeouts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.sidecar.tailer import Batch, TailConfig, Tailer, source_name

ITER = ("[default7]: [2025-03-31 05:54:07] iteration {i:8d}/  242204 | consumed samples: {c:12d} | "
        "elapsed time per iteration (ms): 1552.8 | learning rate: 8.000000E-06 | global batch size:  1008 | "
        "lm loss: 6.258318E+00 | loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |\n")


def iteration_lines(start: int, count: int) -> bytes:
    return "".join(ITER.format(i=i, c=i * 1008) for i in range(start, start + count)).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(patterns: list[str], clock: Clock | None = None, **config: object) -> Tailer:
    clock = clock or Clock()
    return Tailer(patterns, TailConfig(**config), monotonic=clock, wall=clock)


def drain(tailer: Tailer, *, partial: bool = False) -> list[Batch]:
    tailer.scan()
    while tailer.poll(1 << 30):
        pass
    return tailer.take(close_open=True, partial=partial)


def by_file(batches: list[Batch]) -> dict[str, list[Batch]]:
    out: dict[str, list[Batch]] = {}
    for batch in batches:
        out.setdefault(batch.file_id, []).append(batch)
    return out


def assert_contiguous(batches: list[Batch]) -> None:
    for before, after in zip(batches, batches[1:], strict=False):
        assert after.offset == before.end, "a file's batches must follow each other byte for byte"


def test_lines_leave_in_contiguous_batches_that_rebuild_the_file(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    content = iteration_lines(1, 3000)
    log.write_bytes(content)
    batches = drain(make([str(tmp_path / "*.log")], batch_bytes=64 << 10))
    assert len(batches) > 5 and all(len(b.body) <= 64 << 10 for b in batches)
    assert_contiguous(batches)
    assert batches[0].offset == 0 and batches[-1].end == len(content)
    assert b"".join(b.body for b in batches) == content
    assert {b.source for b in batches} == {str(log)}


def test_a_partial_last_line_waits_for_its_end_then_for_the_timeout(tmp_path: Path) -> None:
    clock = Clock()
    log = tmp_path / "rank0.log"
    log.write_bytes(b"first line\nsecond li")
    tailer = make([str(log)], clock, partial_timeout_s=5.0)
    assert b"".join(b.body for b in drain(tailer)) == b"first line\n"
    with open(log, "ab") as handle:
        handle.write(b"ne\nthird")
    batches = drain(tailer)
    assert b"".join(b.body for b in batches) == b"second line\n"
    assert batches[0].offset == len(b"first line\n")
    clock.now += 6
    tailer.poll(1 << 20)
    flushed = tailer.take(close_open=True)
    assert [b.body for b in flushed] == [b"third\n"] and flushed[0].end == log.stat().st_size


def test_an_over_long_line_keeps_its_head_and_the_range_stays_whole(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    giant = b"x" * 5000
    log.write_bytes(b"before\n" + giant + b"\nafter\n")
    tailer = make([str(log)], max_line_bytes=100, max_read_bytes=1024)
    batches = drain(tailer)
    assert_contiguous(batches)
    body = b"".join(b.body for b in batches)
    assert body == b"before\n" + b"x" * 100 + b"\nafter\n"
    assert batches[-1].end == log.stat().st_size
    assert sum(t.lines_cut for t in tailer.files.values()) == 1


def test_rename_rotation_reads_the_old_file_to_its_end_and_the_new_one_from_zero(tmp_path: Path) -> None:
    clock = Clock()
    log = tmp_path / "rank0.log"
    log.write_bytes(iteration_lines(1, 100))
    tailer = make([str(log)], clock, rotate_wait_s=10.0)
    first = drain(tailer)
    with open(log, "ab") as handle:
        handle.write(iteration_lines(101, 50))  # written before the rotation, read after it
    os.rename(log, tmp_path / "rank0.log.1")
    log.write_bytes(iteration_lines(151, 20))
    second = drain(tailer)
    files = by_file(first + second)
    assert len(files) == 2
    text = {fid: b"".join(b.body for b in bs) for fid, bs in files.items()}
    assert sorted(text.values(), key=len) == [iteration_lines(151, 20), iteration_lines(1, 150)]
    assert all(b.source == str(log) for b in first + second), "a rotated file keeps its source name"
    clock.now += 11
    tailer.scan()
    tailer.poll(1 << 20)
    assert len(tailer.files) == 1 and tailer.closed, "the idle rotated file is let go"
    # a glob that also matches rotated names does not read the let-go file again
    tailer.patterns = [str(tmp_path / "rank0.log*")]
    assert drain(tailer) == []


def test_truncation_starts_a_new_generation_under_a_new_file_id(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(iteration_lines(1, 50))
    tailer = make([str(log)])
    before = drain(tailer)
    log.write_bytes(b"restarted\n")  # truncates in place (same inode)
    after = drain(tailer)
    assert [b.body for b in after] == [b"restarted\n"] and after[0].offset == 0
    assert after[0].file_id != before[0].file_id
    assert after[0].file_id.split(".")[1] == before[0].file_id.split(".")[1], "same inode"


@pytest.mark.parametrize("copy_name", ["rank0.log.1", "rank0.log-20251125"])
def test_copytruncate_loses_no_line(tmp_path: Path, copy_name: str) -> None:
    """logrotate's copytruncate: the lines written after the last read and before the copy
    are only in the copy; they are read from it, under the old file's id, before the new
    content (6 of 505 lines were lost without a word)."""
    log = tmp_path / "rank0.log"
    log.write_bytes(iteration_lines(1, 100))
    tailer = make([str(log)])
    first = drain(tailer)
    with open(log, "ab") as handle:
        handle.write(iteration_lines(101, 30) + b"a last line without its end")
    (tmp_path / copy_name).write_bytes(log.read_bytes())  # copy, then truncate in place
    os.truncate(log, 0)
    with open(log, "ab") as handle:
        handle.write(iteration_lines(131, 20))
    second = drain(tailer)
    files = by_file(first + second)
    text = sorted((b"".join(b.body for b in bs) for bs in files.values()), key=len)
    assert text == [iteration_lines(131, 20), iteration_lines(1, 130) + b"a last line without its end\n"]
    assert tailer.truncated_unread == 0


def test_a_truncation_without_a_copy_is_counted(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(iteration_lines(1, 10))
    tailer = make([str(log)])
    drain(tailer)
    os.truncate(log, 0)
    log.write_bytes(b"restarted\n")
    drain(tailer)
    assert tailer.truncated_unread == 1


def test_files_with_the_same_first_line_are_different_files(tmp_path: Path) -> None:
    banner = b"*****************************************\n"
    for rank in range(2):
        (tmp_path / f"rank{rank}.log").write_bytes(banner + f"rank {rank}\n".encode())
    batches = drain(make([str(tmp_path / "rank*.log")]))
    assert len({b.file_id for b in batches}) == 2
    assert len({b.file_id.split(".")[0] for b in batches}) == 1, "same fingerprint, told apart by inode"


def test_read_from_end_skips_what_is_there_and_a_half_written_line(tmp_path: Path) -> None:
    old = tmp_path / "rank0.log"
    old.write_bytes(b"old line\nhalf of a li")
    tailer = make([str(tmp_path / "*.log")], read_from="end")
    assert drain(tailer) == []
    with open(old, "ab") as handle:
        handle.write(b"ne\nnew line\n")
    (tmp_path / "rank1.log").write_bytes(b"a file that appears later is read from its start\n")
    batches = drain(tailer)
    bodies = {b.source.rsplit("/", 1)[-1]: b.body for b in batches}
    assert bodies == {"rank0.log": b"new line\n", "rank1.log": b"a file that appears later is read from its start\n"}
    skipped = next(b for b in batches if b.source.endswith("rank0.log"))
    assert skipped.offset == len(b"old line\nhalf of a li"), "the range covers the skipped rest of the line"


def test_a_restart_finds_a_file_rotated_out_of_the_globs_by_inode_and_fingerprint(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(iteration_lines(1, 100))
    tailer = make([str(log)])
    batches = drain(tailer)
    acked = batches[-1].end
    entries = {t.file_id: {**t.entry(), "offset": acked} for t in tailer.tracked()}
    tailer.close()
    # while the sidecar is down: more lines, then the rotation
    with open(log, "ab") as handle:
        handle.write(iteration_lines(101, 30))
    os.rename(log, tmp_path / "rank0.log.1")
    log.write_bytes(iteration_lines(131, 10))
    again = make([str(log)])
    again.resume(entries)
    rest = by_file(drain(again))
    assert sorted(b"".join(b.body for b in bs) for bs in rest.values()) == sorted(
        [iteration_lines(101, 30), iteration_lines(131, 10)])
    resumed = rest[next(iter(entries))]
    assert resumed[0].offset == acked


def test_crlf_and_bare_cr_are_line_ends_and_a_split_crlf_is_one(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"one\r\ntwo\r")
    tailer = make([str(log)])
    assert b"".join(b.body for b in drain(tailer)) == b"one\r\n"
    with open(log, "ab") as handle:
        handle.write(b"\n 45%|####\r 46%|####\rthree\n")
    assert b"".join(b.body for b in drain(tailer)) == b"two\r\n 45%|####\r 46%|####\rthree\n"


@pytest.mark.parametrize("path,expected", [("logs/rank0.log", "logs/rank0.log"),
                                           ("logs/rank0.log.1", "logs/rank0.log"),
                                           ("/var/log/train/node-3.out.12", "/var/log/train/node-3.out")])
def test_source_names_drop_rotation_suffixes(path: str, expected: str) -> None:
    assert source_name(path) == expected


def test_a_line_cut_by_the_buffer_bound_is_not_a_partial_line(tmp_path: Path) -> None:
    clock = Clock()
    log = tmp_path / "rank0.log"
    content = iteration_lines(1, 100)
    log.write_bytes(content)
    tailer = make([str(log)], clock, partial_timeout_s=5.0)
    tailer.scan()
    tailer.poll(1000)  # the buffer had room for 1000 bytes: the read stops mid-line
    clock.now += 60  # the server is slow: nothing is read for a minute
    tailer.poll(0)
    while tailer.poll(1 << 20):
        pass
    body = b"".join(b.body for b in tailer.take(close_open=True))
    assert body == content, "the line the read stopped in is whole, not split in two"
