"""A training job's per-rank log files, written as a Megatron-LM job on 8 GPUs writes them
with NCCL_DEBUG=INFO (LOG_FORMATS.md sections 1.4, 2.1, 2.12): NCCL bootstrap and ring
set-up on every rank, the arguments dump on rank 0, per-step collective traces (NCCL's COLL
subsystem: the volume), the iteration line from the last rank, timers from rank 0, and a
checkpoint every `checkpoint_every` steps. Files can be rotated the way logrotate's `create`
mode does it (rename to `.N`, open a new file under the old name).

Every byte written is accounted for: `manifest()` gives each physical file's size, line
count and CRC-32, which is what the service must end up with, exactly once.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

NODE = "gcn6"
PID = 1080060
ARGS = ["accumulate_allreduce_grads_in_fp32", "adam_beta1", "adam_beta2", "adam_eps", "apply_query_key_layer_scaling",
        "bf16", "clip_grad", "data_parallel_size", "global_batch_size", "hidden_size", "log_interval", "lr",
        "lr_decay_style", "micro_batch_size", "num_attention_heads", "num_layers", "pipeline_model_parallel_size",
        "save_interval", "seq_length", "tensor_model_parallel_size", "train_iters", "world_size"]


def nccl_init(rank: int, ranks: int) -> list[str]:
    head = f"{NODE}:{PID + rank}:{PID + rank}"
    lines = [f"{head} [{rank}] NCCL INFO Bootstrap : Using ibp12s0:10.149.0.32<0>",
             f"{head} [{rank}] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
             f"{head} [{rank}] NCCL INFO cudaDriverVersion 12010",
             f"{head} [{rank}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ibp12s0:10.149.0.32<0>",
             f"{head} [{rank}] NCCL INFO Using network IB"]
    thread = f"{NODE}:{PID + rank}:{PID + rank + 294}"
    for channel in range(16):
        lines.append(f"{thread} [{rank}] NCCL INFO Channel {channel:02d}/16 :    " +
                     " ".join(str((rank + i) % ranks) for i in range(ranks)))
    lines.append(f"{thread} [{rank}] NCCL INFO Trees [0] {(rank + 1) % ranks}/-1/-1->{rank}->{(rank - 1) % ranks}")
    lines.append(f"{thread} [{rank}] NCCL INFO comm 0x558ef922a470 rank {rank} nranks {ranks} cudaDev {rank} "
                 f"nvmlDev {rank} busId {rank + 1}b000 commId 0x7ef9513a104d9d97 - Init COMPLETE")
    return lines


def collectives(rank: int, ranks: int, op_count: int) -> list[str]:
    head = f"{NODE}:{PID + rank}:{PID + rank}"
    return [f"{head} [{rank}] NCCL INFO {op}: opCount {op_count + i:x} sendbuff 0x7f2c{rank:02d}000000 "
            f"recvbuff 0x7f2c{rank:02d}800000 count {count} datatype 7 op 0 root 0 comm 0x558ef922a470 "
            f"[nranks={ranks}] stream 0x558ef8e1c3d0"
            for i, (op, count) in enumerate((("AllReduce", 262144), ("AllGather", 1048576),
                                             ("ReduceScatter", 1048576)))]


def iteration(step: int, total: int, loss: float) -> str:
    return (f" [2025-03-31 05:{(step // 60) % 60:02d}:{step % 60:02d}] iteration {step:8d}/{total:8d} | "
            f"consumed samples: {step * 1008:12d} | elapsed time per iteration (ms): 1552.8 | "
            f"throughput per GPU (TFLOP/s/GPU): 134.0 | learning rate: 8.000000E-06 | global batch size:  1008 | "
            f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 |")


def timers() -> list[str]:
    return ["(min, max) time across ranks (ms):",
            "    forward-backward ...............................: (1394.39, 1395.09)",
            "    forward-compute ................................: (512.10, 530.77)",
            "    backward-compute ...............................: (840.20, 861.02)",
            "    optimizer ......................................: (63.01, 63.40)"]


def rank_lines(rank: int, ranks: int, step: int, total_steps: int) -> list[str]:
    """What one rank prints for one training step."""
    lines = collectives(rank, ranks, step * 3)
    if rank == ranks - 1:
        lines.append(iteration(step, total_steps, 6.2 - step * 1e-5))
    if rank == 0 and step % 10 == 0:
        lines += timers()
    if rank == 0 and step % 500 == 0:
        lines += [f"saving checkpoint at iteration {step:7d} to /ckpt/gpt-7b in torch_dist format",
                  f"  successfully saved checkpoint from iteration {step:7d} to /ckpt/gpt-7b [ t 1/1, p 1/1 ]"]
    return lines


@dataclass
class RankFiles:
    """The files of one job, appended to in steps, rotated on demand."""

    folder: Path
    ranks: int = 8
    total_steps: int = 100_000
    step: int = 0
    lines_written: int = 0
    rotations: int = 0
    _started: bool = False
    _handles: dict[int, object] = field(default_factory=dict)
    _files: dict[Path, list[int]] = field(default_factory=dict)
    """Every physical file by its current path: [bytes, lines, crc32]."""

    def path(self, rank: int) -> Path:
        return self.folder / f"rank{rank}.log"

    def _write(self, rank: int, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode()
        handle = self._handles.get(rank)
        if handle is None:
            handle = self._handles[rank] = open(self.path(rank), "ab", buffering=0)  # noqa: SIM115
            self._files[self.path(rank)] = [0, 0, 0]
        handle.write(data)
        record = self._files[self.path(rank)]
        record[0] += len(data)
        record[1] += len(lines)
        record[2] = zlib.crc32(data, record[2])
        self.lines_written += len(lines)

    def write_lines(self, count: int) -> None:
        """Write whole steps until at least `count` more lines are out."""
        target = self.lines_written + count
        if not self._started:
            self._started = True
            for rank in range(self.ranks):
                head = nccl_init(rank, self.ranks)
                if rank == 0:
                    head = (["------------------------ arguments ------------------------"]
                            + [f"  {a} {'.' * (48 - len(a))} {i}" for i, a in enumerate(ARGS)]
                            + ["-------------------- end of arguments ---------------------", "training ..."] + head)
                self._write(rank, head)
        while self.lines_written < target:
            self.step += 1
            for rank in range(self.ranks):
                self._write(rank, rank_lines(rank, self.ranks, self.step, self.total_steps))

    def rotate(self) -> None:
        """logrotate `create`: rename every rank file to `.N`, the next write opens a new one."""
        self.rotations += 1
        for rank in range(self.ranks):
            handle = self._handles.pop(rank, None)
            if handle is not None:
                handle.close()
            current = self.path(rank)
            if current.exists():
                rotated = current.with_name(f"{current.name}.{self.rotations}")
                os.rename(current, rotated)
                self._files[rotated] = self._files.pop(current)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def manifest(self) -> list[tuple[int, int, str]]:
        """(bytes, lines, crc32 hex) of every physical file written, sorted."""
        return sorted((size, lines, f"{crc:08x}") for size, lines, crc in self._files.values())
