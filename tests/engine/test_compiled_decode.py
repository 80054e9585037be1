"""Compiled decode steps (``--compile``) on a tiny model, in float32.

The compiled graphs must give what eager gives: the same greedy tokens (and transformers'),
logprobs within a tight tolerance, also when a batch of 3 is padded to the bucket of 4, and the
same stream as the finished output. A second engine start in a fresh process must load the
graphs from the on-disk cache instead of compiling them again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from parity_support import count_compiled_steps

from cpu_support import AVX2_ONLY, fake_cpu
from ferrollm import LLM, SamplingParams
from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.distributed.state import ParallelState
from ferrollm.engine import AsyncEngine, RequestOutput
from ferrollm.executor.buckets import bucket_for
from ferrollm.executor.compiled_decode import CompiledDecode, build_compiled_decode
from ferrollm.executor.kv_cache import KVCache, KVCacheSpec
from ferrollm.executor.loader import load_model_source
from ferrollm.layers.attention import TorchSDPABackend
from ferrollm.layers.linear import QUANTIZED_MAX_ROWS, dense_copies_pay
from ferrollm.layers.paged_attention import PagedKernelBackend
from ferrollm.models.llama import LlamaForCausalLM
from tiny_gguf import write_tiny_gguf

NUM_NEW_TOKENS = 8
PROMPTS = ["Hello world", "The quick brown fox jumps over", "def f(x): return x * 2"]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=2)
#: Up to 4 rows: buckets 1, 2 and 4 (few graphs, so CI compiles quickly).
OPTIONS: dict[str, Any] = {"dtype": "float32", "max_num_seqs": 4, "kv_cache_memory": "4MiB"}


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh on-disk compile cache for this module (shared by its engines)."""
    path = tmp_path_factory.mktemp("inductor")
    old = os.environ.get("FERROLLM_COMPILE_CACHE")
    os.environ["FERROLLM_COMPILE_CACHE"] = str(path)
    yield path
    if old is None:
        del os.environ["FERROLLM_COMPILE_CACHE"]
    else:
        os.environ["FERROLLM_COMPILE_CACHE"] = old


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("tied")


@pytest.fixture(scope="module")
def compiled(model_dir: Path, compile_cache: Path) -> LLM:
    llm = LLM(model_dir, compile="on", **OPTIONS)
    graphs = llm.engine.runner.compiled
    assert isinstance(graphs, CompiledDecode) and graphs.buckets == (1, 2, 4)
    return llm


@pytest.fixture(scope="module")
def eager(model_dir: Path) -> LLM:
    llm = LLM(model_dir, compile="off", **OPTIONS)
    assert llm.engine.runner.compiled is None
    return llm


def tokens_and_logprobs(output: RequestOutput) -> tuple[list[int], torch.Tensor]:
    (completion,) = output.outputs
    assert completion.logprobs is not None
    return completion.token_ids, torch.tensor([lp.logprob for lp in completion.logprobs])


def test_compiled_batch_equals_eager_alone_and_transformers(
    compiled: LLM, eager: LLM, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = count_compiled_steps(compiled, monkeypatch)
    batch = compiled.generate(PROMPTS, GREEDY)
    # Three rows decode together, padded to the bucket of 4.
    assert 3 in rows and bucket_for(3) == 4
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for prompt, output in zip(PROMPTS, batch, strict=True):
        (alone,) = eager.generate(prompt, GREEDY)
        ours, ours_lp = tokens_and_logprobs(output)
        theirs, theirs_lp = tokens_and_logprobs(alone)
        assert ours == theirs, prompt
        torch.testing.assert_close(ours_lp, theirs_lp, atol=1e-4, rtol=0)
        ids = torch.tensor([output.prompt_token_ids])
        hf = reference.generate(
            ids, do_sample=False, max_new_tokens=NUM_NEW_TOKENS, min_new_tokens=NUM_NEW_TOKENS
        )
        assert hf[0, ids.shape[1] :].tolist() == ours, prompt


def test_compiled_top_logprobs_equal_eager(compiled: LLM, eager: LLM) -> None:
    for ours, theirs in zip(
        compiled.generate(PROMPTS, GREEDY), eager.generate(PROMPTS, GREEDY), strict=True
    ):
        ours_lps, theirs_lps = ours.outputs[0].logprobs, theirs.outputs[0].logprobs
        assert ours_lps is not None and theirs_lps is not None
        for a, b in zip(ours_lps, theirs_lps, strict=True):
            assert len(a.top) == 2
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            torch.testing.assert_close(
                torch.tensor([lp for _, lp in a.top]),
                torch.tensor([lp for _, lp in b.top]),
                atol=1e-4,
                rtol=0,
            )


def test_compiled_stream_equals_the_finished_output(
    compiled: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = count_compiled_steps(compiled, monkeypatch)
    engine = AsyncEngine(compiled.engine)  # steps on its own thread

    async def stream(prompt: str) -> list[RequestOutput]:
        return [o async for o in engine.generate(engine.request(prompt, GREEDY))]

    async def main() -> list[list[RequestOutput]]:
        try:
            return list(await asyncio.gather(*(stream(p) for p in PROMPTS)))
        finally:
            engine.shutdown()

    streams = asyncio.run(main())
    assert rows  # the engine thread ran the compiled graphs
    batch = compiled.generate(PROMPTS, GREEDY)
    for streamed, whole in zip(streams, batch, strict=True):
        final = streamed[-1].outputs[0]
        assert [t for o in streamed for t in o.outputs[0].new_token_ids] == final.token_ids
        assert "".join(o.outputs[0].new_text for o in streamed) == final.text
        assert final.token_ids == whole.outputs[0].token_ids
        assert final.text == whole.outputs[0].text


def test_steps_past_the_largest_bucket_run_eagerly(
    compiled: LLM, eager: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = compiled.engine.runner
    assert runner.compiled is not None
    monkeypatch.setattr(runner.compiled, "max_rows", 2)
    rows = count_compiled_steps(compiled, monkeypatch)
    # Rows finish one after another: steps of 3, then 2, then 1 rows.
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 5, NUM_NEW_TOKENS)
    ]
    out = compiled.generate(PROMPTS, params)
    assert set(rows) == {1, 2}  # the 3-row steps ran eagerly
    assert [o.outputs[0].token_ids for o in out] == [
        o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)
    ]


_START = """
import json, sys, time
from torch._dynamo.utils import counters
from ferrollm import LLM
start = time.perf_counter()
LLM(sys.argv[1], compile="on", dtype="float32", max_num_seqs=1, kv_cache_memory=sys.argv[2])
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "seconds": time.perf_counter() - start}))
"""


def test_a_second_start_loads_the_graphs_from_the_disk_cache(
    model_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "FERROLLM_COMPILE_CACHE": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)

    def start(kv_cache_memory: str) -> dict[str, float]:
        done = subprocess.run(
            [sys.executable, "-c", _START, str(model_dir), kv_cache_memory],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    first = start("4MiB")
    assert first["misses"] >= 1 and first["hits"] == 0
    # A KV cache of another size too: its block count is not baked into the graphs.
    second = start("8MiB")
    assert second["hits"] >= 1 and second["misses"] == 0
    assert any(tmp_path.iterdir())  # the cache lives where it was told to


_CACHE_DIR = """
from ferrollm.executor.compiled_decode import compile_cache_dir
print(compile_cache_dir())
"""


def test_graphs_compiled_under_an_isa_cap_live_apart_from_the_uncapped_ones(
    tmp_path: Path,
) -> None:
    """A graph cached by a process capped at AVX2 (``make test-avx2``) and loaded by one that
    is not corrupted the second one's heap: each set of capabilities gets its own directory,
    on any CPU (the cap differs even where the hardware has no more than AVX2)."""

    def cache_dir(caps: dict[str, str]) -> Path:
        env = {**os.environ, "FERROLLM_COMPILE_CACHE": str(tmp_path), **caps}
        for name in ("FERROLLM_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
            if name not in caps:
                env.pop(name, None)
        done = subprocess.run(
            [sys.executable, "-c", _CACHE_DIR], env=env, capture_output=True, text=True, check=True
        )
        return Path(done.stdout.strip().splitlines()[-1])

    native = cache_dir({})
    capped = cache_dir(
        {"FERROLLM_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    )
    assert native.parent == capped.parent == tmp_path
    assert native != capped
    assert "avx2" in capped.name


def test_compile_option_is_checked() -> None:
    with pytest.raises(EngineConfigError, match="`compile` must be one of auto, on, off") as bad:
        EngineConfig(compile="yes")
    assert bad.value.field == "compile"


def test_auto_is_off_in_float32_and_on_needs_the_kernel(model_dir: Path) -> None:
    llm_model = LLM(model_dir, compile="off", **OPTIONS).engine.runner.model
    spec = KVCacheSpec(2, 2, 16, 16, torch.float32)
    cache = KVCache(spec, 4, torch.device("cpu"))
    args = (llm_model, cache, TorchSDPABackend(), torch.float32, 64, 4)
    assert build_compiled_decode("auto", *args) is None
    assert build_compiled_decode("off", *args) is None
    with pytest.raises(EngineConfigError, match="paged attention kernel") as bad:
        build_compiled_decode("on", *args)
    assert bad.value.field == "compile"
    with torch.device("meta"):
        config = load_model_source(str(model_dir)).config
        sharded = LlamaForCausalLM(config, None, ParallelState(0, 2))
    shard_args = (sharded, cache, PagedKernelBackend(), torch.bfloat16, 64, 4)
    assert build_compiled_decode("auto", *shard_args) is None
    with pytest.raises(EngineConfigError, match="tensor parallelism") as bad:
        build_compiled_decode("on", *shard_args)
    assert bad.value.field == "compile"


@pytest.mark.parametrize("cpu", ["bf16-units", "avx2-only"])
def test_compiled_quantized_bfloat16_leaves_the_packed_copies_eager(
    model_dir: Path,
    compile_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu: str,
) -> None:
    """``dtype="bfloat16"`` on a GGUF, on a CPU with bfloat16 units: Q4_1 blocks, with
    oneDNN-packed copies for many-row steps (``auto`` stays in float32, without them).
    Graphs over packed weights cannot be cached on disk, so only the steps of up to
    ``QUANTIZED_MAX_ROWS`` rows (the block kernels) are compiled; more rows run eagerly. A
    CPU without them (AVX2-only) keeps no copy: the block kernels run, compiled, at every row
    count."""
    if cpu == "bf16-units":
        if not dense_copies_pay(torch.bfloat16):
            pytest.skip("oneDNN bfloat16 copies need avx512_bf16 or amx_bf16, absent here")
    else:
        fake_cpu(monkeypatch, *AVX2_ONLY)
    path = write_tiny_gguf(model_dir, tmp_path / "tiny.gguf", "llama", "Q4_1")
    options: dict[str, Any] = {"dtype": "bfloat16", "max_num_seqs": 8, "kv_cache_memory": "4MiB"}
    compiled = LLM(path, compile="on", **options)
    eager = LLM(path, compile="off", **options)
    layer = compiled.engine.runner.model.model.layers[0].mlp.gate_up_proj  # type: ignore[attr-defined]
    assert layer.quantized is not None
    graphs = compiled.engine.runner.compiled
    assert isinstance(graphs, CompiledDecode)
    packed = cpu == "bf16-units"
    assert (layer.packed is not None) == packed and layer.weight is None
    assert graphs.buckets == ((1, 2, 4) if packed else (1, 2, 4, 8))
    rows = count_compiled_steps(compiled, monkeypatch)
    prompts = [f"{prompt} {i}" for i in range(2) for prompt in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=1)
    for batch in (prompts[:3], prompts):  # three rows compiled, six eager
        ours, theirs = compiled.generate(batch, params), eager.generate(batch, params)
        same = 0
        for a, b in zip(ours, theirs, strict=True):
            (a_tokens, a_lp), (b_tokens, b_lp) = tokens_and_logprobs(a), tokens_and_logprobs(b)
            # bfloat16: fused and eager kernels round differently, so compare loosely.
            same += a_tokens[0] == b_tokens[0]
            assert abs(float(a_lp[0]) - float(b_lp[0])) < 0.1
        assert same >= len(batch) - 1
    assert 3 in rows
    assert all(r <= QUANTIZED_MAX_ROWS for r in rows) if packed else 6 in rows


def test_each_engine_runs_its_own_graphs(
    compiled: LLM,
    model_dir: Path,
    compile_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graphs drop the guards on the model's attributes (a loaded model never changes
    them), so an engine must never be handed another engine's graphs: a second model of the
    same shapes whose only difference is a constant baked into the graph (the norms' epsilon)
    gives its own eager outputs, compiled, in the same process."""
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 0.5
    (other / "config.json").write_text(json.dumps(config))
    theirs = LLM(other, compile="on", **OPTIONS)
    rows = count_compiled_steps(theirs, monkeypatch)
    for engine, model in ((theirs, other), (compiled, model_dir)):
        reference = LLM(model, compile="off", **OPTIONS)
        ours, eager = engine.generate(PROMPTS, GREEDY), reference.generate(PROMPTS, GREEDY)
        for a, b in zip(ours, eager, strict=True):
            (a_tokens, a_lp), (b_tokens, b_lp) = tokens_and_logprobs(a), tokens_and_logprobs(b)
            assert a_tokens == b_tokens
            torch.testing.assert_close(a_lp, b_lp, atol=1e-4, rtol=0)
            assert runner_ups(a) == pytest.approx(runner_ups(b), abs=1e-4)
    assert rows
    # The epsilon matters: the two models' runner-up logprobs differ.
    (a,), (b,) = theirs.generate(PROMPTS[0], GREEDY), compiled.generate(PROMPTS[0], GREEDY)
    assert runner_ups(a) != pytest.approx(runner_ups(b), abs=1e-3)


def runner_ups(output: RequestOutput) -> list[float]:
    """The second-best token's logprob at each step."""
    logprobs = output.outputs[0].logprobs
    assert logprobs is not None
    return [step.top[1][1] for step in logprobs]


def test_auto_compiles_block_weights_in_float32(
    model_dir: Path, compile_cache: Path, tmp_path: Path
) -> None:
    """A dense float32 model is the parity mode and stays eager under ``auto``; a model on GGUF
    blocks (which already differ from that reference by their int8 activations) is compiled in
    float32 too, and decodes what eager decodes."""
    path = write_tiny_gguf(model_dir, tmp_path / "tiny.gguf", "llama", "Q4_1")
    auto = LLM(path, **OPTIONS)
    assert isinstance(auto.engine.runner.compiled, CompiledDecode)
    eager = LLM(path, compile="off", **OPTIONS)
    for a, b in zip(auto.generate(PROMPTS, GREEDY), eager.generate(PROMPTS, GREEDY), strict=True):
        (a_tokens, a_lp), (b_tokens, b_lp) = tokens_and_logprobs(a), tokens_and_logprobs(b)
        assert a_tokens == b_tokens
        torch.testing.assert_close(a_lp, b_lp, atol=1e-4, rtol=0)
    assert LLM(model_dir, **OPTIONS).engine.runner.compiled is None
