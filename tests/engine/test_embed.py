"""The embedding engine against sentence-transformers on the default embedding model (the same
weights), and tiny random BERT/RoBERTa encoders against transformers' ``AutoModel``."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ferrollm._core import NewRequest, PrefillScheduler
from ferrollm.default_model import default_embedding_model_path
from ferrollm.engine.embed import Embedder, EmbedTokenizer, embed_scheduler_config
from ferrollm.models.bert import BertConfig, load_bert
from ferrollm.models.config import UnsupportedModelError
from ferrollm.models.pooling import EmbedSpec, pool

_TEXT = (
    "the quick brown fox jumps over lazy dog inference server packs tokens without padding "
    "embedding vectors cosine similarity retrieval passage query model attention layer"
)
_WORDS = _TEXT.split()


def mixed_texts(count: int, seed: int = 0) -> list[str]:
    """English and CJK texts from one word to well past 512 tokens."""
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        n = rng.choice([1, 2, 5, 20, 60, 150, 300, 450])
        if i % 3 == 2:
            texts.append("".join(chr(rng.randint(0x4E00, 0x4FFF)) for _ in range(n)))
        else:
            texts.append(" ".join(rng.choice(_WORDS) for _ in range(n)))
    return texts


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.from_path(dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def st_reference() -> tuple[list[str], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_embedding_model_path()), device="cpu")
    texts = mixed_texts(200)
    return texts, st.encode(texts, batch_size=32, convert_to_numpy=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize(
    ("budget", "max_seqs", "one_at_a_time"),
    [(16384, 256, False), (8192, 256, True), (256, 3, False)],
    ids=["packed", "one-at-a-time", "tiny-budget"],
)
def test_matches_sentence_transformers(
    embedder: Embedder,
    st_reference: tuple[list[str], np.ndarray],
    budget: int,
    max_seqs: int,
    one_at_a_time: bool,
) -> None:
    texts, expected = st_reference
    ids = embedder.encode(texts, truncate=True)
    lengths = [len(i) for i in ids]
    assert min(lengths) <= 3 and max(lengths) == embedder.max_input_tokens == 256
    embedder.max_num_batched_tokens, embedder.max_num_seqs = budget, max_seqs
    if one_at_a_time:
        got = np.concatenate([embedder.embed([i]) for i in ids])
    else:
        got = embedder.embed(ids)
    assert got.shape == expected.shape == (200, 384)
    assert cosines(got, expected).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)  # Normalize module


def test_default_model_declares_its_modules(embedder: Embedder) -> None:
    assert embedder.spec == EmbedSpec("mean", True, 256, "")
    assert embedder.tokenizer.num_prefix == 1 and embedder.tokenizer.num_suffix == 1


def test_truncation_keeps_the_specials(embedder: Embedder) -> None:
    tok = embedder.tokenizer
    long = tok.encode_batch(["word " * 400])[0]
    cut = tok.truncate(long, 10)
    assert len(long) == 402 and cut == long[:9] + long[-1:]
    assert embedder.encode(["word " * 400])[0] == long  # not cut unless asked


def _packed_steps(lengths: list[int], budget: int, seats: int) -> list[list[int]]:
    """The rows (input numbers) of each step of an embedder's prefill-only scheduler."""
    scheduler = PrefillScheduler(
        embed_scheduler_config(budget, seats, budget, max(len(lengths), 1))
    )
    for i, n in enumerate(lengths):
        scheduler.add_request(NewRequest(i, [1] * n, arrival_time=float(i)))
    steps = []
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule(1e6)
        assert plan.num_samples == 0 and plan.num_scheduled_tokens <= budget
        steps.append(plan.req_ids.tolist())
        out = scheduler.update(plan, [])
        assert out.finished_req_ids.tolist() == steps[-1]
        assert scheduler.stats()["num_used_blocks"] == 0
    return steps


def test_the_scheduler_packs_whole_inputs_in_order_within_the_budget() -> None:
    assert _packed_steps([5, 5, 5, 10, 1], 10, 8) == [[0, 1], [2], [3], [4]]
    assert _packed_steps([1] * 5, 100, 2) == [[0, 1], [2, 3], [4]]
    assert _packed_steps([], 10, 2) == []
    rng = random.Random(1)
    lengths = [rng.randint(1, 64) for _ in range(500)]
    steps = _packed_steps(lengths, 128, 16)
    assert [i for s in steps for i in s] == list(range(500))
    assert all(len(s) <= 16 and sum(lengths[i] for i in s) <= 128 for s in steps)


def test_inputs_longer_than_the_step_budget_are_refused(embedder: Embedder) -> None:
    from ferrollm._core import ValidationError

    budget = embedder.max_num_batched_tokens
    try:
        embedder.max_num_batched_tokens = 100
        assert embedder.max_input_tokens == 100  # the model takes 256: never split an input
        with pytest.raises(ValidationError, match="`prompt_token_ids` has 101 tokens"):
            embedder.embed([[101] * 101])
        assert embedder.embed([[101] * 100]).shape == (1, 384)
    finally:
        embedder.max_num_batched_tokens = budget


def test_pool_modes() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)
    cu = torch.tensor([0, 2, 6])

    def run(mode: str) -> list[list[float]]:
        return pool(hidden, cu, EmbedSpec(mode, False)).tolist()

    assert run("cls") == [[0, 1], [4, 5]]
    assert run("last") == [[2, 3], [10, 11]]
    assert run("mean") == [[1, 2], [7, 8]]
    assert run("max") == [[2, 3], [10, 11]]
    normed = pool(hidden, cu, EmbedSpec("cls", True))
    torch.testing.assert_close(normed.norm(dim=1), torch.ones(2))


def _tiny_encoder(kind: str, directory: Path) -> None:
    import transformers

    torch.manual_seed(0)
    sizes = dict(
        vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=80, pad_token_id=1,
    )  # fmt: skip
    if kind == "bert":
        config = transformers.BertConfig(**sizes, type_vocab_size=2)
    else:
        config = transformers.RobertaConfig(**sizes, type_vocab_size=1)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():
        for p in model.parameters():  # norms and biases random too: a misload shows
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(directory)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_tiny_encoder_matches_transformers(kind: str, tmp_path: Path) -> None:
    import transformers

    _tiny_encoder(kind, tmp_path)
    reference = transformers.AutoModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_bert(tmp_path, torch.device("cpu"), torch.float32)
    rng = torch.Generator().manual_seed(3)
    max_len = ours.config.max_input_tokens
    assert max_len == (80 if kind == "bert" else 78)  # RoBERTa positions start after pad id
    lengths = [1, 7, max_len, 33]
    inputs = [torch.randint(2, 200, (n,), generator=rng) for n in lengths]
    cu = torch.tensor([0, *np.cumsum(lengths)])
    with torch.no_grad():
        packed = ours(torch.cat(inputs), cu)
        for i, ids in enumerate(inputs):
            expected = reference(input_ids=ids[None]).last_hidden_state[0]
            torch.testing.assert_close(packed[cu[i] : cu[i + 1]], expected, atol=1e-4, rtol=1e-4)


def test_encoder_config_refusals() -> None:
    base = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=8)  # fmt: skip
    with pytest.raises(UnsupportedModelError, match="model_type 'llama'"):
        BertConfig.from_dict({**base, "model_type": "llama"})
    with pytest.raises(UnsupportedModelError, match="position_embedding_type"):
        BertConfig.from_dict({**base, "model_type": "bert", "position_embedding_type": "rel"})


def test_plain_directory_needs_a_pooling(tmp_path: Path) -> None:
    _tiny_encoder("bert", tmp_path)
    src = default_embedding_model_path() / "tokenizer.json"
    (tmp_path / "tokenizer.json").write_text(src.read_text())
    with pytest.raises(UnsupportedModelError, match="pass `pooling`"):
        Embedder.from_path(tmp_path, device="cpu")
    e = Embedder.from_path(tmp_path, device="cpu", pooling="cls")
    assert e.spec == EmbedSpec("cls", True) and e.max_input_tokens == 80
    out = e.embed([[5, 6, 7], [8]])
    assert out.shape == (2, 64)


def test_tokenizer_without_specials_truncates_plainly() -> None:
    tok = EmbedTokenizer((default_embedding_model_path() / "tokenizer.json").read_text())
    assert tok.truncate([1, 2, 3], 5) == [1, 2, 3]
    assert tok.vocab_size == 30522


def test_embed_task_options() -> None:
    from ferrollm.config import EngineConfig, EngineConfigError

    assert EngineConfig(task="embed", pooling="cls").pooling == "cls"
    cases = [
        ({"task": "rerank"}, "task"),
        ({"pooling": "mean"}, "pooling"),  # pooling needs task embed
        ({"task": "embed", "pooling": "sum"}, "pooling"),
        ({"task": "embed", "kv_cache_memory": "1GiB"}, "kv_cache_memory"),
        ({"task": "embed", "quantization": "int8"}, "quantization"),
    ]
    for options, field in cases:
        with pytest.raises(EngineConfigError, match=f"`{field}`"):
            EngineConfig(**options)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_embedder_matches_transformers(pooling: str, tmp_path: Path) -> None:
    import transformers

    from tiny_models import build_tiny_model

    model_dir = build_tiny_model("qwen3", tmp_path)
    e = Embedder.from_path(model_dir, device="cpu", dtype="float32", pooling=pooling)
    e.max_num_batched_tokens = 72  # several packed steps, and a KV cache that grows
    reference = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = torch.Generator().manual_seed(5)
    inputs = [torch.randint(3, 300, (n,), generator=rng).tolist() for n in (1, 17, 33, 5, 70)]
    got = e.embed(inputs)
    with torch.no_grad():
        for i, ids in enumerate(inputs):
            hidden = reference(input_ids=torch.tensor([ids])).last_hidden_state[0]
            vec = hidden[-1] if pooling == "last" else hidden.mean(0)
            want = torch.nn.functional.normalize(vec, dim=0).numpy()
            np.testing.assert_allclose(got[i], want, atol=1e-4, rtol=1e-4)


def test_decoder_needs_a_pooling(tmp_path: Path) -> None:
    from tiny_models import build_tiny_model

    model_dir = build_tiny_model("llama3", tmp_path)
    with pytest.raises(UnsupportedModelError, match="pass `pooling`"):
        Embedder.from_path(model_dir, device="cpu")
