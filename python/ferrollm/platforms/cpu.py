"""The CPU platform: torch SDPA over gathered KV blocks; memory is the host's."""

from __future__ import annotations

from ferrollm.layers.attention import AttentionBackend, TorchSDPABackend
from ferrollm.platforms import Platform


class CpuPlatform(Platform):
    """Runs everything on the host CPU."""

    name = "cpu"
    dist_backend = "gloo"

    def attention_backend(self) -> AttentionBackend:
        """Plain-torch paged attention (gather, then SDPA)."""
        return TorchSDPABackend()

    def synchronize(self) -> None:
        """CPU ops are synchronous: nothing to wait for."""

    def free_memory_bytes(self) -> int:
        """Available host memory (Linux ``/proc/meminfo``; 0 where it cannot be read)."""
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0
