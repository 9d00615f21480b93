"""Shingles, exact Jaccard, and MinHash signatures (datasketch) for near-duplicate search.

A document is compared through the set of its shingles: character n-grams (default,
n = 5) or word n-grams of its normalized text (lowercased, whitespace runs collapsed).
Each shingle is hashed to 64 bits with a vectorized polynomial hash, so a shingle set is
a sorted ``uint64`` array and exact Jaccard is one ``np.intersect1d``. Hash collisions at
64 bits are negligible at corpus scale (about n^2 / 2^65 for n distinct shingles).

MinHash signatures come from datasketch (``affine32`` scheme, the 2.x default) fed with
the low 32 bits of those hashes, so the same shingles drive both the estimate and the
exact check.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import regex

_WS = regex.compile(r"\s+")
_P = np.uint64(0x100000001B3)  # FNV-64 prime as the polynomial base
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer constants
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK32 = np.uint64(0xFFFFFFFF)


@dataclass(frozen=True)
class ShingleConfig:
    """How a document becomes a set of shingles; stored with fingerprints and pair files."""

    size: int = 5  # n in n-gram
    unit: str = "char"  # "char" or "word"

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"--shingle-size must be >= 1, got {self.size}")
        if self.unit not in ("char", "word"):
            raise ValueError(f"--shingle-unit must be 'char' or 'word', got {self.unit!r}")


def add_shingle_args(p) -> None:
    """--shingle-size / --shingle-unit, shared by the scripts that shingle documents."""
    p.add_argument("--shingle-size", type=int, default=5, help="n of the n-gram shingles (default 5).")
    p.add_argument("--shingle-unit", choices=["char", "word"], default="char",
                   help="shingle characters or words of the normalized text (default char).")


def normalize(text: str) -> str:
    """Lowercase and collapse whitespace, so reflowed copies still match."""
    return _WS.sub(" ", text.lower()).strip()


def _mix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


def _ngram_hashes(codes: np.ndarray, n: int) -> np.ndarray:
    """Hash every window of n consecutive uint64 codes (polynomial, wrapping mod 2^64)."""
    if codes.size == 0:
        return codes
    if codes.size < n:  # a text shorter than one shingle is a single shingle
        n = codes.size
    m = codes.size - n + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _P + codes[k:k + m]
        return _mix64(h)


def _word_codes(words: list[str]) -> np.ndarray:
    """Stable 64-bit code per word (blake2b; Python's hash() is salted per process)."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest(), "little")
                        for w in words), dtype=np.uint64, count=len(words))


def shingle_hashes(text: str, config: ShingleConfig = ShingleConfig()) -> np.ndarray:
    """Sorted unique uint64 hashes of the shingles of ``text`` (empty for empty text)."""
    norm = normalize(text)
    if not norm:
        return np.zeros(0, dtype=np.uint64)
    if config.unit == "char":
        codes = np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    else:
        codes = _word_codes(norm.split(" "))
    return np.unique(_ngram_hashes(codes, config.size))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique hash arrays (1.0 for two empty sets)."""
    if a.size == 0 and b.size == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (a.size + b.size - inter)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer: the pre-mix datasketch's affine32 scheme applies."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _identity(x):
    return x


class Signer:
    """MinHash signatures of shingle-hash arrays with datasketch.

    One set of permutations is built per (num_perm, seed) and shared by every
    signature, so signatures from different runs and processes are comparable.
    """

    scheme = "affine32"

    def __init__(self, num_perm: int = 128, seed: int = 1234):
        from datasketch import MinHash  # imported here: datasketch pulls in scipy (~1 s)
        self._minhash_cls = MinHash
        self.num_perm, self.seed = num_perm, seed
        self._template = self._minhash_cls(num_perm=num_perm, seed=seed, hashfunc=_identity, scheme=self.scheme)

    def signature(self, hashes: np.ndarray) -> np.ndarray:
        """(num_perm,) uint32 MinHash values of the set whose shingle hashes are given.

        Bit-identical to ``MinHash.update_batch`` on the same 32-bit values (a test checks
        it), but vectorized: update_batch runs a Python call per shingle, ~3x slower here.
        """
        a, b = self._template.permutations  # (num_perm,) uint32 each; a odd
        if hashes.size == 0:
            return self._template.hashvalues.copy()
        hv = _fmix32((hashes & _MASK32).astype(np.uint32))[:, None]  # (S, 1)
        return (hv * a[None, :] + b[None, :]).min(axis=0)  # (S, num_perm) wraps mod 2^32 -> (num_perm,)

    def signature_reference(self, hashes: np.ndarray) -> np.ndarray:
        """The same signature through datasketch's own update path (for tests)."""
        m = self._minhash_cls(num_perm=self.num_perm, seed=self.seed, hashfunc=_identity,
                    permutations=self._template.permutations, scheme=self.scheme)
        m.update_batch((hashes & _MASK32).tolist())
        return m.hashvalues

    def minhash(self, signature: np.ndarray) -> "datasketch.MinHash":
        """A datasketch MinHash carrying stored signature values (for LSH insert/query)."""
        return self._minhash_cls(num_perm=self.num_perm, seed=self.seed, hashfunc=_identity,
                       hashvalues=signature, permutations=self._template.permutations,
                       scheme=self.scheme)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """MinHash estimate: the fraction of equal signature slots."""
    return float(np.count_nonzero(sig_a == sig_b)) / sig_a.size
