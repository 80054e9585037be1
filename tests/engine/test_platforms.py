"""The platform layer: detection order, explicit devices, and the NPU module without torch_npu.

The NPU attention backend cannot run here; it is checked against a stand-in for
``torch_npu.npu_fused_infer_attention_score`` written from the kernel's documented semantics
(TND queries, paged keys through ``block_table``, right-down causal), which must agree with the
CPU backend on a real scheduler plan. That checks the metadata we hand the kernel, not the kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ferrollm import NewRequest, SamplingParams, Scheduler, SchedulerConfig
from ferrollm.layers.attention import TorchSDPABackend
from ferrollm.layers.paged_attention import PagedKernelBackend
from ferrollm.platforms import (
    DEVICE_NAMES,
    MemoryInfo,
    Platform,
    current_platform,
    detect_device,
    get_platform,
)
from ferrollm.platforms import npu as npu_module
from ferrollm.platforms.cpu import CpuPlatform
from ferrollm.platforms.cuda import CudaPlatform
from ferrollm.platforms.npu import NpuPagedAttentionBackend, NpuPlatform


@pytest.fixture
def no_accelerators(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(NpuPlatform, "available", classmethod(lambda cls: False))
    monkeypatch.setattr(CudaPlatform, "available", classmethod(lambda cls: False))
    current_platform.cache_clear()  # detect again under the patch, and again after it
    yield
    current_platform.cache_clear()


def test_detection_order_is_npu_cuda_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEVICE_NAMES == ("npu", "cuda", "cpu")
    monkeypatch.setattr(CudaPlatform, "available", classmethod(lambda cls: True))
    monkeypatch.setattr(NpuPlatform, "available", classmethod(lambda cls: True))
    assert detect_device() == "npu"
    monkeypatch.setattr(NpuPlatform, "available", classmethod(lambda cls: False))
    assert detect_device() == "cuda"
    monkeypatch.setattr(CudaPlatform, "available", classmethod(lambda cls: False))
    assert detect_device() == "cpu"


@pytest.mark.usefixtures("no_accelerators")
def test_without_accelerators_the_platform_is_cpu() -> None:
    platform = get_platform()
    assert isinstance(platform, CpuPlatform)
    assert platform.device == torch.device("cpu")
    assert platform.dist_backend == "gloo"
    assert not platform.is_accelerator


def test_detection_here_matches_what_torch_sees() -> None:
    expected = "cuda" if CudaPlatform.available() else "cpu"  # no torch_npu on test machines
    assert detect_device() == expected
    assert get_platform() is current_platform()  # decided once
    assert current_platform().name == expected


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "`device` must be one of npu, cuda, cpu; got 'tpu'"),
        ("CPU", "`device` must be one of npu, cuda, cpu; got 'CPU'"),
        ("npu", "`device` is 'npu' but no npu device is available here"),
    ],
)
def test_explicit_bad_device_is_a_clear_error(device: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get_platform(device)


@pytest.mark.usefixtures("no_accelerators")
def test_explicit_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="`device` is 'cuda' but no cuda device"):
        get_platform("cuda")


def test_explicit_cpu_overrides_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CudaPlatform, "available", classmethod(lambda cls: True))
    assert isinstance(get_platform("cpu"), CpuPlatform)


def test_cpu_memory_and_sync() -> None:
    platform = CpuPlatform()
    info = platform.memory_info()
    assert isinstance(info, MemoryInfo)
    assert 0 < info.free <= info.total
    platform.synchronize()
    assert isinstance(platform.attention_backend(), PagedKernelBackend)
    assert platform.preferred_dtype == torch.float32


def test_npu_module_imports_and_is_unavailable_without_torch_npu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` fail
    assert NpuPlatform.available() is False
    assert "NOT RUN ON HARDWARE" in (npu_module.__doc__ or "")
    platform = NpuPlatform()  # constructing touches no device
    assert (platform.name, platform.dist_backend) == ("npu", "hccl")
    assert platform.preferred_dtype == torch.bfloat16
    assert torch.float32 not in platform.supported_dtypes


@pytest.mark.parametrize(
    ("block_size", "ok"), [(16, False), (128, True), (512, True), (640, False)]
)
def test_npu_block_size_rule(block_size: int, ok: bool) -> None:
    if ok:
        NpuPlatform().check_block_size(block_size)
    else:
        with pytest.raises(ValueError, match=f"multiple of 128.*got {block_size}"):
            NpuPlatform().check_block_size(block_size)
    CpuPlatform().check_block_size(block_size)  # any size on CPU


def _fake_fused_infer_attention_score(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The documented TND + page-attention + sparse_mode=3 semantics, one row at a time."""
    assert kw["input_layout"] == "TND" and kw["sparse_mode"] == 3
    assert kw["atten_mask"].shape == (2048, 2048) and bool(kw["atten_mask"][0, 1])
    heads, kv_heads, size = kw["num_heads"], kw["num_key_value_heads"], kw["block_size"]
    out, start = torch.empty_like(query), 0
    for b, (end, kv_len) in enumerate(
        zip(kw["actual_seq_lengths"], kw["actual_seq_lengths_kv"], strict=True)
    ):
        blocks = kw["block_table"][b, : -(-kv_len // size)].long()
        k = key[blocks].reshape(-1, kv_heads, query.shape[-1])[:kv_len]
        v = value[blocks].reshape(-1, kv_heads, query.shape[-1])[:kv_len]
        q = query[start:end]
        # Right-down causal: the last query sees every key, earlier ones one fewer each.
        mask = torch.ones(len(q), kv_len, dtype=torch.bool).tril(kv_len - len(q))
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1).repeat_interleave(heads // kv_heads, 0),
            v.transpose(0, 1).repeat_interleave(heads // kv_heads, 0),
            attn_mask=mask,
            scale=kw["scale"],
        )
        out[start:end] = o.transpose(0, 1)
        start = end
    return out, torch.zeros(1)


@pytest.fixture
def fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(npu_fused_infer_attention_score=_fake_fused_infer_attention_score)
    monkeypatch.setattr(npu_module, "_torch_npu", lambda: fake)


def _mixed_plans(block_size: int) -> Iterator[Any]:
    """Plans of a real scheduler: prefills, a chunked prefill, a prefix hit and decodes."""
    scheduler = Scheduler(
        SchedulerConfig(
            num_blocks=64, block_size=block_size, max_num_batched_tokens=40, max_model_len=64
        )
    )
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    shared = list(range(3, 40))
    late = {2: [*shared, 7, 8]}  # joins once `shared` is cached: a prefix hit
    for i, prompt in enumerate([shared, [5, 6, 7], list(range(50, 95))]):
        scheduler.add_request(NewRequest(i, prompt, params))
    step = 0
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        yield plan
        scheduler.update(plan, np.full(plan.num_samples, 9, dtype=np.int64))
        step += 1
        if step in late:
            scheduler.add_request(NewRequest(10 + step, late[step], params))


@pytest.mark.usefixtures("fake_torch_npu")
def test_npu_backend_matches_the_cpu_backend_on_scheduler_plans() -> None:
    block_size, heads, kv_heads, dim = 4, 4, 2, 8
    generator = torch.Generator().manual_seed(0)
    shape = (64, block_size, kv_heads, dim)
    caches = {name: (torch.zeros(shape), torch.zeros(shape)) for name in "ab"}
    npu, cpu = NpuPagedAttentionBackend(), TorchSDPABackend()
    for plan in _mixed_plans(block_size):
        num_tokens = len(plan.input_ids)
        q = torch.randn(num_tokens, heads, dim, generator=generator)
        k, v = (torch.randn(num_tokens, kv_heads, dim, generator=generator) for _ in "kv")
        meta_npu = npu.prepare(plan, block_size, torch.device("cpu"))
        meta_cpu = cpu.prepare(plan, block_size, torch.device("cpu"))
        out_npu = npu.forward(q, k, v, caches["a"], meta_npu, dim**-0.5)
        out_cpu = cpu.forward(q, k, v, caches["b"], meta_cpu, dim**-0.5)
        torch.testing.assert_close(out_npu, out_cpu)
    torch.testing.assert_close(caches["a"], caches["b"])


def test_npu_backend_refuses_sliding_windows() -> None:
    plan = next(_mixed_plans(4))
    with pytest.raises(NotImplementedError, match="sliding-window"):
        NpuPagedAttentionBackend().prepare(plan, 4, torch.device("cpu"), sliding_window=8)


def test_every_platform_names_its_backends() -> None:
    names = {cls.name: cls.dist_backend for cls in (CpuPlatform, CudaPlatform, NpuPlatform)}
    assert names == {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
    assert all(issubclass(cls, Platform) for cls in (CpuPlatform, CudaPlatform, NpuPlatform))


@pytest.mark.cuda
def test_cuda_platform_on_a_gpu() -> None:
    platform = get_platform("cuda")
    assert platform.device.type == "cuda"
    assert platform.preferred_dtype == torch.bfloat16
    info = platform.memory_info()
    assert 0 < info.free <= info.total
    x = torch.ones(4, device=platform.device)
    platform.synchronize()
    assert float(x.sum()) == 4.0
