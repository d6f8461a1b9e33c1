"""A line that a terminal or a paste wrapped: its rest is not a failure of its own for the
Failure Agent, and a line that merely starts in lower case after a long one is not a rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.failure_agent import chunk_lines, wrapped_rest
from rules.model import KeptLine
from service.context import Context
from rules.job import JobMeta
from service.ingest.sources import feed_path
from service.settings import Settings

NCCL_HEAD = ("[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the "
             "asynchronous nature of CUDA kernels, subsequent GPU opera")
NANOGPT = Path(__file__).resolve().parents[2] / "fixtures" / "real" / "user4" / "nanogpt-multinode-ddp-nccl-ib-disable-55.log"


def kept(number: int, text: str, source: str = "train.log") -> KeptLine:
    return KeptLine(number, text, True, source)


@pytest.mark.parametrize(("head", "tail"), [
    (NCCL_HEAD, "tions might run on corrupted/incomplete data."),  # cut mid-word at the width
    ("RuntimeError: The server socket has failed to listen on any local network",  # 80-column word wrap
     "address. The server socket has failed to bind to [::]:29600 (errno: 98 - Address"),
])
def test_the_rest_of_a_wrapped_line_continues_it(head: str, tail: str) -> None:
    assert wrapped_rest(kept(7, head), kept(8, tail))


@pytest.mark.parametrize(("head", "tail"), [
    # a line of its own that starts in lower case: a dotted name, a call
    ("[2024-05-01 10:00:00] INFO some long launcher line about the workers and their groups",
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
    ("[2024-05-01 10:00:00] INFO some long launcher line about the workers and their groups",
     "raise(ValueError('bad'))"),
    # the line before closed its message
    ("RuntimeError: The server socket has failed to listen on any local network address.",
     "address already in use"),
    # too short to have filled a terminal
    ("CUDA error: an illegal", "memory access was encountered"),
])
def test_a_line_of_its_own_is_not_a_rest(head: str, tail: str) -> None:
    assert not wrapped_rest(kept(7, head), kept(8, tail))


def test_only_the_next_line_of_the_same_file_continues() -> None:
    head = kept(7, NCCL_HEAD)
    assert not wrapped_rest(head, kept(9, "tions might run on corrupted/incomplete data."))
    assert not wrapped_rest(head, kept(8, "tions might run on corrupted/incomplete data.", source="rank1.log"))
    assert not wrapped_rest(None, kept(1, "tions might run on corrupted/incomplete data."))


def test_the_rest_is_structure_and_the_head_stays_a_chunk() -> None:
    chunks = chunk_lines([kept(7, NCCL_HEAD), kept(8, "tions might run on corrupted/incomplete data.")], None)
    assert [(c.message[:20], c.structural) for c in chunks] == [(NCCL_HEAD[:20], False), ("tions might run on c", True)]


def test_a_real_wrapped_paste_is_not_diagnosed_by_its_fragment(minilm, tmp_path) -> None:
    # nanogpt's multi-node DDP failure, posted from a terminal that cut NCCL's message at its
    # width: the fragment on the next line was named as the root cause (an out-of-memory)
    with Context.open(Settings(data_dir=tmp_path / "data"), embedder=minilm) as ctx:
        run = ctx.new_run(JobMeta())
        feed_path(run, str(NANOGPT))
        root = run.finish().to_dict()["root_cause"]
    assert root is not None and root["line"].startswith("[E ProcessGroupNCCL.cpp:455] Some NCCL operations")
