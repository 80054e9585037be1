"""`EncoderCache`: media encoder outputs by content digest, least recently used first out.

A media item's embeddings are needed at every step that computes some of its placeholder
positions: each chunk of a chunked prefill, a recompute after preemption, and every request
that holds the same image. Encoding is the expensive part (a vision transformer over every
tile), so outputs are kept by ``MediaInput.digest`` within a byte budget, on the device they
were made on. A budget of 0 keeps nothing: every use encodes again (same outputs, slower).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from ferrollm.config import DEFAULT_ENCODER_CACHE_MEMORY
from ferrollm.multimodal.inputs import MediaInput

#: Encodes a batch of items: one ``[item.length, hidden]`` tensor each.
Encode = Callable[[Sequence[MediaInput]], list[torch.Tensor]]


class EncoderCache:
    """Encoder outputs by digest, LRU within ``capacity_bytes``; counts hits and misses."""

    def __init__(self, encode: Encode, capacity_bytes: int = DEFAULT_ENCODER_CACHE_MEMORY) -> None:
        self._encode = encode
        self._capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.num_bytes = 0
        #: Lookups served from the cache, and items encoded (a miss each).
        self.hits = 0
        self.misses = 0

    @property
    def capacity_bytes(self) -> int:
        """The budget in bytes; 0 disables the cache."""
        return self._capacity_bytes

    @capacity_bytes.setter
    def capacity_bytes(self, value: int) -> None:
        self._capacity_bytes = value
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        """Counters: hits, misses (items encoded), entries and bytes held."""
        return {
            "encoder_cache_hits": self.hits,
            "encoder_cache_misses": self.misses,
            "encoder_cache_entries": len(self._entries),
            "encoder_cache_bytes": self.num_bytes,
        }

    def get(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """Each item's encoder output, in order; the missing ones (each digest once) are
        encoded in one batch and kept."""
        found: dict[str, torch.Tensor] = {}
        missing: dict[str, MediaInput] = {}
        for item in items:
            if item.digest in found or item.digest in missing:
                continue
            cached = self._entries.get(item.digest)
            if cached is None:
                missing[item.digest] = item
            else:
                self._entries.move_to_end(item.digest)
                found[item.digest] = cached
                self.hits += 1
        if missing:
            outputs = self._encode(list(missing.values()))
            self.misses += len(missing)
            for (digest, item), output in zip(missing.items(), outputs, strict=True):
                if output.shape[0] != item.length:
                    raise ValueError(
                        f"the encoder gave {output.shape[0]} rows for a media item of "
                        f"{item.length} placeholder tokens"
                    )
                found[digest] = output
                self._put(digest, output)
        return [found[item.digest] for item in items]

    def _put(self, digest: str, output: torch.Tensor) -> None:
        size = output.numel() * output.element_size()
        if size > self.capacity_bytes:
            return
        self._entries[digest] = output
        self.num_bytes += size
        self._evict()

    def _evict(self) -> None:
        """Drop the least recently used entries until the held bytes fit the budget."""
        while self._entries and self.num_bytes > self._capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= evicted.numel() * evicted.element_size()
