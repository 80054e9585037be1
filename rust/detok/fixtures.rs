//! Three small tokenizers trained at run time, one per decoder family the detokenizer must get
//! right: byte-level BPE (GPT-2 / Qwen / Llama-3), SentencePiece-style BPE with byte fallback
//! (Llama-2 / Mistral) and WordPiece (BERT). Tests and `benches/detok.rs` share this file (the
//! bench includes it with `#[path]`), so it uses only the `tokenizers` crate and std.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::metaspace::{Metaspace, PrependScheme};
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainer, Merges, Vocab, BPE};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::{BertNormalizer, Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{AddedToken, Model, Tokenizer};

/// A small multilingual corpus: English prose, code, CJK, accents (precomposed and combining),
/// other scripts and emoji (with skin tones, ZWJ families and flags).
pub const CORPUS: &str = concat!(
    r#"The quick brown fox jumps over the lazy dog. It wasn't the dog's fault, really.
Streaming detokenization must never cut a character in half; hold bytes back until they decode.
In 2024, the model generated 1,234 tokens per second on a single GPU (about 0.8 ms per token).
fn main() { let v: Vec<u32> = (0..10).map(|x| x * 2).collect(); println!("{:?}", v); }
def decode(ids: list[int]) -> str:
    return "".join(vocab[i] for i in ids if i not in special)
{"model": "llama", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
SELECT name, COUNT(*) FROM requests WHERE status = 'done' GROUP BY name ORDER BY 2 DESC;
我们的推理服务器使用连续批处理和分页注意力，以提高吞吐量并降低延迟。
人工智能正在改变世界，大语言模型可以写代码、翻译文章、回答问题。
今天天气很好，我们去公园散步吧。北京、上海、广州和深圳都是大城市。
日本語のテキストも含まれています。ひらがな、カタカナ、そして漢字。東京は大きな都市です。
한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다. 서울은 아름다운 도시입니다.
Café, naïve, façade, jalapeño, Straße, Ærø, Øresund, Œuvre, crème brûlée, São Paulo.
"#,
    "Combining marks: e\u{301} a\u{308} n\u{303} o\u{302} — cafe\u{301} and re\u{301}sume\u{301}.\n",
    r#"Français: « Où est la bibliothèque ? » Español: ¿Dónde está la estación? Deutsch: Grüße aus Köln.
Русский текст: Привет, как дела? Ελληνικά: Καλημέρα κόσμε. עברית: שלום עולם. العربية: مرحبا بالعالم.
हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก Tiếng Việt: Xin chào thế giới.
Emoji: 😀 😃 😄 😁 🎉 🚀 ❤️ 👍🏽 👩🏽‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 🇯🇵 🇺🇸 🧑‍🚀 🐍 🦀 ✨ 🔥 💯
Math and symbols: ∑ᵢ xᵢ² ≤ ∞, π ≈ 3.14159, √2, ∀x ∈ ℝ, α β γ δ → ⇒ ↔ ≠ ± × ÷ € £ ¥ © ® ™ °C
The scheduler admits waiting requests by priority, then spends one token budget across them.
Prefix caching reuses KV blocks across requests that share a prompt prefix, saving compute.
When blocks run out, the lowest-priority request is preempted and later recomputed.
"#,
    "    indented code\twith\ttabs and  double  spaces   and trailing spaces   \n",
    r#"Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.5 -7 1e-5 0xFF 0b1010 42nd 3rd
URLs: https://example.com/path?query=1&lang=zh-CN#section and user@example.org
中文和English混合的句子，比如说GPU、CUDA和Python都很常见。
模型输出：“你好！我是一个人工智能助手，很高兴为你服务。”
东西南北，春夏秋冬，山水花鸟，风雨雷电，龙凤麒麟。
"#
);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// The special tokens of the byte-level fixture (Qwen / GPT-2 style).
pub const BYTE_LEVEL_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The special tokens of the SentencePiece fixture (Llama-2 style; ids 0, 1, 2).
pub const SENTENCEPIECE_SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];
/// The special tokens of the WordPiece fixture (BERT style).
pub const WORDPIECE_SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

fn specials(names: &[&str]) -> Vec<AddedToken> {
    names.iter().map(|&s| AddedToken::from(s, true)).collect()
}

fn train(tokenizer: &mut Tokenizer, trainer: impl Into<TrainerWrapper>) {
    let mut trainer = trainer.into();
    tokenizer
        .train(&mut trainer, CORPUS.lines())
        .expect("training on the fixture corpus succeeds");
}

/// GPT-2 style byte-level BPE: ByteLevel pre-tokenizer and decoder, every byte in the initial
/// alphabet, special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, plus the non-special
/// added token `<think>`.
pub fn byte_level() -> Tokenizer {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let trainer = BpeTrainer::builder()
        .vocab_size(1200)
        .show_progress(false)
        .initial_alphabet(alphabet)
        .special_tokens(specials(&BYTE_LEVEL_SPECIALS))
        .build();
    train(&mut tokenizer, trainer);
    let _ = tokenizer.add_tokens(vec![AddedToken::from("<think>", false)]);
    tokenizer
}

/// Llama-2 style BPE with byte fallback: `<unk>`, `<s>`, `</s>` at ids 0..3, `<0x00>`..`<0xFF>`
/// at ids 3..259, a Prepend("▁") + Replace(" ", "▁") normalizer, and the decoder
/// Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]. The alphabet is limited,
/// so rare CJK characters and most emoji are spelled with byte tokens.
pub fn sentencepiece() -> Tokenizer {
    let (trained_vocab, merges) = train_sentencepiece_model();
    let mut vocab = Vocab::default();
    for name in SENTENCEPIECE_SPECIALS {
        vocab.insert(name.to_string(), vocab.len() as u32);
    }
    for byte in 0..=255u8 {
        vocab.insert(format!("<0x{byte:02X}>"), vocab.len() as u32);
    }
    let mut trained: Vec<(String, u32)> = trained_vocab.into_iter().collect();
    trained.sort_by_key(|(_, id)| *id);
    for (token, _) in trained {
        let next = vocab.len() as u32;
        vocab.entry(token).or_insert(next);
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token("<unk>".to_string())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .expect("a consistent vocabulary and merges");
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(sentencepiece_normalizer()))
        .expect("a valid normalizer");
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Never, true)));
    tokenizer.with_decoder(Some(sentencepiece_decoder()));
    let _ = tokenizer.add_special_tokens(specials(&SENTENCEPIECE_SPECIALS));
    tokenizer
}

fn sentencepiece_normalizer() -> NormalizerSequence {
    let replace = Replace::new(" ", "▁").expect("a literal pattern");
    NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), replace.into()])
}

/// The Llama-2 decoder: Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)].
pub fn sentencepiece_decoder() -> DecoderWrapper {
    let replace = Replace::new("▁", " ").expect("a literal pattern");
    DecoderWrapper::Sequence(DecoderSequence::new(vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ]))
}

/// Trains the SentencePiece-style merges on the corpus with a limited alphabet and returns the
/// vocabulary (without specials) and merges, read back through the model's own files.
fn train_sentencepiece_model() -> (Vocab, Merges) {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer
        .with_normalizer(Some(sentencepiece_normalizer()))
        .expect("a valid normalizer");
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Never, true)));
    let trainer = BpeTrainer::builder()
        .vocab_size(900)
        .show_progress(false)
        .limit_alphabet(160)
        .build();
    train(&mut tokenizer, trainer);
    let dir = std::env::temp_dir().join(format!(
        "ferrollm-detok-fixture-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a writable temp dir");
    let files = tokenizer
        .get_model()
        .save(&dir, None)
        .expect("the model saves");
    let path = |name: &str| {
        let found = files.iter().find(|p| p.ends_with(name));
        found
            .expect("vocab.json and merges.txt")
            .to_string_lossy()
            .into_owned()
    };
    let (vocab, merges) =
        BPE::read_file(&path("vocab.json"), &path("merges.txt")).expect("files just written");
    let _ = std::fs::remove_dir_all(&dir);
    (vocab, merges)
}

/// BERT style WordPiece: BertNormalizer (lower-casing, accent stripping, CJK split), BertPreTokenizer,
/// WordPiece decoder with cleanup, `[CLS] … [SEP]` post-processing.
pub fn wordpiece() -> Tokenizer {
    let model = WordPiece::builder()
        .unk_token("[UNK]".to_string())
        .build()
        .expect("a valid model");
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(BertNormalizer::default()))
        .expect("a valid normalizer");
    tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer.with_decoder(Some(WordPieceDecoder::default()));
    let trainer = WordPieceTrainer::builder()
        .vocab_size(900)
        .show_progress(false)
        .special_tokens(specials(&WORDPIECE_SPECIALS))
        .build();
    train(&mut tokenizer, trainer);
    let id = |name: &str| {
        tokenizer
            .token_to_id(name)
            .expect("a trained special token")
    };
    let processor =
        BertProcessing::new(("[SEP]".into(), id("[SEP]")), ("[CLS]".into(), id("[CLS]")));
    tokenizer.with_post_processor(Some(processor));
    tokenizer
}
