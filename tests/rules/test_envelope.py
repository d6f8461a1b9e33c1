"""The launcher envelope: what is a prefix (and names a node) and what is the message."""

from __future__ import annotations

import pytest

from rules.envelope import split_envelope


@pytest.mark.parametrize(("line", "node", "message"), [
    ("rdma-test-gpu-worker-1: RuntimeError: boom", "rdma-test-gpu-worker-1", "RuntimeError: boom"),
    ("10.140.0.17: [rank3]: CUDA error", "10.140.0.17", "CUDA error"),
    ("[lrdn0137:0]: Traceback (most recent call last):", "lrdn0137", "Traceback (most recent call last):"),
    ("gpu-node-07.cluster.local: NCCL WARN x", "gpu-node-07.cluster.local", "NCCL WARN x"),
])
def test_a_host_prefix_names_the_node(line: str, node: str, message: str) -> None:
    env = split_envelope(line)
    assert (env.node, env.message.lstrip()) == (node, message)


@pytest.mark.parametrize("line", [
    # a shared object's file name has hyphens too, but underscores, which no host name has
    # (RFC 1123): it is the message (the linker's error), not a pdsh host
    "flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    "fused_adam_cuda.cpython-38-x86_64-linux-gnu.so: cannot open shared object file",
])
def test_a_file_name_with_underscores_is_no_host(line: str) -> None:
    env = split_envelope(line)
    assert env.node is None and env.message == line
