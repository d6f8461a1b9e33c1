"""The Failure Agent on this CPU: a 100 MB log's compressed form embedded and searched, and
the knowledge base at 10,000 incidents.

    python -m bench.failure_agent_bench [--size-mb 100] [--incidents 10000] [--embed-incidents N]

1. A Megatron-style log of --size-mb (torchrun envelope, iteration lines from the last rank,
   NCCL INFO bursts at each restart, warnings and unexplained chatter that no filter drops,
   a few transient error lines) ends in a failure no built-in rule knows (a ROCm memory
   access fault on one rank, NCCL watchdog timeouts on the others). The pipeline filters it;
   then the agent's own work is timed, cold (no cached vectors): chunking the compressed
   log, embedding the chunks, the per-job FAISS index, the search of the knowledge base and
   the votes; then the whole agent again with the vectors cached (a second job of the same
   shapes). The model load is timed apart (once per process). The machine's load average
   is recorded: the figures are CPU-bound and move with it.
2. A knowledge base of --incidents incidents (the seeds plus confirmed root-cause lines made
   from the novel fixtures' wordings with other values): FAISS index size in memory and on
   disk, the time to rebuild it from stored vectors (what a replica does), search latency,
   and the embedding rate (measured on --embed-incidents of them; the total is extrapolated
   when fewer than all are embedded).

Figures go to stdout and bench/out/failure_agent.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


MODULES = [f"/usr/local/lib/python3.10/dist-packages/{m}.py" for m in (
    "torch/nn/modules/module", "torch/utils/data/dataloader", "transformer_engine/pytorch/attention",
    "megatron/core/transformer/attention", "apex/normalization/fused_layer_norm", "torch/_dynamo/eval_frame",
    "torch/distributed/fsdp/_state_dict_utils", "deepspeed/runtime/zero/stage3", "torch/cuda/memory",
    "megatron/core/datasets/blended_megatron_dataset_builder", "torch/amp/grad_scaler", "torch/optim/lr_scheduler",
    "transformers/modeling_utils", "torch/distributed/checkpoint/state_dict_saver", "wandb/sdk/wandb_run")]
CATEGORIES = ["UserWarning", "FutureWarning", "DeprecationWarning", "RuntimeWarning", "ResourceWarning"]
SUBJECTS = ["the attention mask", "the fused kernel", "activation checkpointing", "the learning rate scheduler",
            "the data index cache", "the tokenizer vocabulary", "gradient accumulation fusion", "the rotary embedding",
            "sequence parallelism", "the optimizer state", "the CUDA graph capture", "the distributed sampler",
            "tensor parallel communication overlap", "the async checkpoint writer", "the loss scaler"]
VERBS = ["is deprecated and will be removed in a future release", "falls back to a slower implementation",
         "was not found in the cache and will be rebuilt", "is experimental", "ignores the given dtype",
         "was called before the optimizer step", "uses more memory than expected", "is not supported on this device",
         "will change its default in the next version", "was set twice; the last value is used"]


def write_log(path: Path, size_mb: int, seed: int = 7) -> int:
    """A healthy-looking Megatron run of about size_mb, then a novel failure; returns bytes."""
    from fixtures.logs.novel_failures import generate

    rng = random.Random(seed)
    target = size_mb << 20
    written = 0
    it = 0
    loss = 2.6
    hosts = [f"gpu-b{n:03d}" for n in range(1, 5)]
    warnings = [
        "[default{r}]:/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:{n}: UserWarning: "
        "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
        "[default{r}]:INFO:megatron.core.optimizer:Setting up optimizer with config OptimizerConfig(lr={lr})",
        "[default{r}]:[W{d} socket.cpp:{n}] [c10d] The client socket cannot be initialized to connect to "
        "[{h}]:{p} (errno: 97 - Address family not supported by protocol).",
        "[default{r}]: > data shard {n} of {m}: {p} documents, {d} tokens",
        "[default{r}]:Retrying checkpoint upload chunk {n} ({p} bytes) after a transient HTTP 503",
    ]
    with open(path, "w", encoding="utf-8") as out:
        def emit(line: str) -> None:
            nonlocal written
            out.write(line + "\n")
            written += len(line) + 1

        while written < target:
            if it % 20000 == 0:  # a (re)start: NCCL INFO from every rank
                for r in range(8):
                    pid = rng.randint(2000, 90000)
                    for c in range(32):
                        emit(f"[default{r}]:{hosts[0]}:{pid}:{pid + 211} [{r}] NCCL INFO Channel {c:02d}/32 :    0   1   "
                             f"2   3   4   5   6   7")
            it += 1
            loss = max(1.4, loss - rng.uniform(0, 0.00002))
            emit(f"[default7]: [2025-05-{1 + it // 100000:02d} {it // 3600 % 24:02d}:{it // 60 % 60:02d}:{it % 60:02d}] "
                 f"iteration {it:8d}/ 2500000 | consumed samples: {it * 1024:12d} | elapsed time per iteration (ms): "
                 f"{rng.uniform(7800, 8400):.1f} | learning rate: {3e-4:.6E} | global batch size:  1024 | lm loss: "
                 f"{loss:.6E} | loss scale: 1.0 | grad norm: {rng.uniform(0.15, 0.4):.3f} | number of skipped "
                 "iterations:   0 | number of nan iterations:   0 |")
            if rng.random() < 0.02:
                emit(rng.choice(warnings).format(r=rng.randrange(8), n=rng.randint(1, 99999), m=rng.randint(1, 999),
                                                 lr=rng.uniform(1e-4, 3e-4), h=rng.choice(hosts), p=rng.randint(1000, 65000),
                                                 d=rng.randint(1000, 9999)))
            if rng.random() < 0.01:  # chatter of many shapes that no filter knows
                emit(f"[default{rng.randrange(8)}]:{rng.choice(MODULES)}:{rng.randint(10, 900)}: "
                     f"{rng.choice(CATEGORIES)}: {rng.choice(SUBJECTS)} {rng.choice(VERBS)}")
        failure = generate("rocm_memory_fault", 0).text.splitlines()
        start = next(i for i, line in enumerate(failure) if "Memory access fault" in line)
        for line in failure[start:]:
            emit(line)
    return written


def agent_on_log(path: Path, embedder, repeat: int = 1) -> dict:
    from agents.failure_agent import FailureAgent, chunk_lines, retrieve
    from agents.knowledge import KnowledgeBase, MemoryIncidents, seed_incidents
    from rules.job import JobMeta, JobRun
    from rules.rulebook import Rulebook
    from service.ingest.sources import feed_path

    rulebook = Rulebook()
    kb = KnowledgeBase(MemoryIncidents(seed_incidents(rulebook.builtin_diagnosis)), embedder)
    kb.refresh()
    run = JobRun(rulebook, JobMeta())
    began = time.perf_counter()
    feed_path(run, str(path))
    rules = run.finish()
    pipeline_s = time.perf_counter() - began
    lines = run.compressed.lines()
    timings = []
    for attempt in range(repeat):
        inner = getattr(embedder, "_cache", None)
        if inner is not None:
            inner.clear()  # cold: every chunk is embedded again
        began = time.perf_counter()
        chunks = chunk_lines(lines, run.classifier.program)
        chunk_s = time.perf_counter() - began
        retrieval = retrieve(lines, run.classifier.program, kb, embedder)
        retrieve_s = time.perf_counter() - began - chunk_s
        agent = FailureAgent(kb, embedder)
        began2 = time.perf_counter()
        decided = agent.diagnose(run, rules)
        total_agent_s = time.perf_counter() - began2
        timings.append({"chunk_s": chunk_s, "retrieve_s": retrieve_s, "agent_s": total_agent_s})
    best = min(timings, key=lambda t: t["agent_s"])
    root = decided.root_cause if decided else None
    return {
        "log_bytes": path.stat().st_size, "lines_in": rules.compression["lines_in"],
        "compressed_lines": len(lines), "chunks": len(chunks), "embedded_chunks": len(retrieval.embedded),
        "candidates": len(retrieval.candidates), "pipeline_s": round(pipeline_s, 2),
        "chunk_s": round(best["chunk_s"], 3), "embed_and_search_s": round(best["retrieve_s"], 2),
        "agent_again_warm_cache_s": round(best["agent_s"], 2),
        "rules_said": f"{rules.root_cause.reason} ({rules.root_cause.source})" if rules.root_cause else None,
        "agent_said": f"{root.reason}/{root.origin} ({root.source})" if root else None,
        "agent_line": root.line[:160] if root else None,
    }


def knowledge_base(n: int, embed_n: int, embedder) -> dict:
    from agents.embeddings import embedding_text, to_bytes
    from agents.incidents import Incident, incident_id
    from agents.knowledge import KnowledgeBase, MemoryIncidents, seed_incidents
    from agents.vector_store import FaissIndex
    from fixtures.logs.novel_failures import generate_all
    from rules.builtin import builtin_diagnosis_rules

    seeds = seed_incidents(builtin_diagnosis_rules())
    labels = [log.label for log in generate_all(seeds=40)]
    rng = random.Random(11)
    items = list(seeds)
    while len(items) < n:
        label = rng.choice(labels)
        # the same wording with other values, as confirmed diagnoses of other jobs would be
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
        line = "".join(str(rng.randint(0, 9)) if ch.isdigit() and rng.random() < 0.7 else ch
                       for ch in label["root_cause_line"]) + f" (job {word})"
        items.append(Incident(incident_id("confirmed", label["reason"], line), line, label["reason"],
                              label["origin"], "cause", label["category"], "", "rule:bench"))
    sample = items[:embed_n]
    began = time.perf_counter()
    vectors = embedder.embed([embedding_text(i.text) for i in sample])
    embed_s = time.perf_counter() - began
    rate = len(sample) / embed_s
    # the rest get vectors near real ones (stored vectors, as a replica reads them): size and
    # search cost depend on the count, not on what the vectors say
    full = np.zeros((len(items), embedder.dim), dtype=np.float32)
    full[:len(sample)] = vectors
    noise = np.random.default_rng(5)
    for i in range(len(sample), len(items)):
        full[i] = vectors[i % len(sample)] + noise.normal(0, 0.05, embedder.dim)
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    source = MemoryIncidents(items)
    source.save_embeddings({i.id: to_bytes(v) for i, v in zip(items, full, strict=True)}, embedder.model_name)

    class NoEmbedding:
        model_name, dim = embedder.model_name, embedder.dim

        def embed(self, texts):
            raise AssertionError("a replica must not embed stored incidents")

    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(source, NoEmbedding(), index_dir=Path(tmp) / "idx")
        began = time.perf_counter()
        kb.refresh()
        rebuild_s = time.perf_counter() - began
        on_disk = sum(f.stat().st_size for f in (Path(tmp) / "idx").iterdir())
        began = time.perf_counter()
        again = FaissIndex.load(Path(tmp) / "idx")
        load_s = time.perf_counter() - began
        queries = full[rng.sample(range(len(items)), 1000)]
        began = time.perf_counter()
        kb.neighbours(queries, 8)
        search_ms = (time.perf_counter() - began) * 1000 / len(queries)
    return {
        "incidents": len(items), "dim": embedder.dim, "index_bytes": kb.index.nbytes,
        "index_mb": round(kb.index.nbytes / 2**20, 2), "on_disk_mb": round(on_disk / 2**20, 2),
        "rebuild_from_stored_vectors_s": round(rebuild_s, 2), "load_saved_index_s": round(load_s, 3),
        "search_ms_per_query_k8": round(search_ms, 3), "embedded_for_rate": len(sample),
        "embed_rate_per_s": round(rate, 1), "embed_all_estimate_s": round(len(items) / rate, 1),
        "loaded_ids": len(again.ids) if again else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--incidents", type=int, default=10_000)
    parser.add_argument("--embed-incidents", type=int, default=1000)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args()
    from agents.vector_store import load_minilm

    began = time.perf_counter()
    embedder = load_minilm()
    embedder.embed(["warm up"])
    load_s = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp:
        path = args.log or Path(tmp) / "job.log"
        if args.log is None:
            write_log(path, args.size_mb)
        log = agent_on_log(path, embedder)
    kb = knowledge_base(args.incidents, args.embed_incidents, embedder)
    figures = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "load_average": os.getloadavg(),
               "cpus": os.cpu_count(), "model_load_s": round(load_s, 2),
               "log": log, "knowledge_base": kb,
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "failure_agent.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))  # noqa: T201 - a benchmark's report


if __name__ == "__main__":
    main()
