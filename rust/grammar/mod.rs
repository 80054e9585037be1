//! Constrained decoding: a request's grammar (a JSON schema, any JSON object, a regex, a choice
//! of strings or a Lark grammar) becomes an llguidance [`Matcher`] over the model's tokenizer,
//! which gives each step's allowed-token mask and consumes the sampled token.
//!
//! [`GrammarCompiler`] owns the tokenizer's token trie (built once from the [`Detokenizer`]'s
//! token bytes; special tokens are marked so no grammar text can produce them, and every EOS id
//! is allowed exactly where the grammar accepts) and a cache of compiled grammars by kind and
//! text. Compiling is bounded by llguidance's limits (lexer fuel, grammar size, Earley items): a
//! schema or regex built to explode fails with an error naming the request's field, never a
//! stuck engine. The caller compiles off the engine thread and hands the matcher to the
//! scheduler with the request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::detok::Detokenizer;
use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;

/// Compiled grammars kept for reuse (the cache is small: each holds its lexer).
const CACHE_SIZE: usize = 64;

/// Largest grammar source accepted (bytes), before llguidance's own size limit.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GrammarKind {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a JSON schema (the text is the schema).
    JsonSchema,
    /// A regular expression over the whole output.
    Regex,
    /// Exactly one of a list of strings (the text is a JSON array of them).
    Choice,
    /// A Lark grammar (llguidance's dialect).
    Lark,
}

impl GrammarKind {
    /// The kind named `name`: "json_object", "json_schema", "regex", "choice" or "lark".
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "json_object" => GrammarKind::JsonObject,
            "json_schema" => GrammarKind::JsonSchema,
            "regex" => GrammarKind::Regex,
            "choice" => GrammarKind::Choice,
            "lark" => GrammarKind::Lark,
            _ => return None,
        })
    }

    /// The name [`GrammarKind::parse`] reads.
    pub fn as_str(&self) -> &'static str {
        match self {
            GrammarKind::JsonObject => "json_object",
            GrammarKind::JsonSchema => "json_schema",
            GrammarKind::Regex => "regex",
            GrammarKind::Choice => "choice",
            GrammarKind::Lark => "lark",
        }
    }
}

/// A request's grammar as validated: its kind, its source text, and the request field it came
/// from (named by every error about it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrammarSpec {
    pub kind: GrammarKind,
    pub text: String,
    pub field: String,
}

/// A compiled grammar's state for one sequence: clone it for each sequence that follows it.
#[derive(Clone)]
pub struct GrammarState {
    matcher: Matcher,
    /// The request field the grammar came from.
    field: Arc<str>,
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState")
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

impl GrammarState {
    /// The tokens allowed next (EOS ids where the grammar accepts; only EOS once it has ended).
    /// Fails when the matcher is in an error state.
    pub fn mask(&mut self) -> CoreResult<SimpleVob> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| self.error("grammar_error", e))
    }

    /// Advances past `token`, which the last mask allowed. EOS is consumed as the end.
    pub fn consume(&mut self, token: TokenId) -> CoreResult<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| self.error("grammar_error", e))
    }

    /// How many of `tokens` the grammar takes in order from this state (it stops at the first
    /// it refuses), and whether it could end right after them. This state is left unchanged.
    pub fn check_tokens(&self, tokens: &[TokenId]) -> (usize, bool) {
        let mut m = self.matcher.clone();
        let taken = m.try_consume_tokens(tokens).unwrap_or(0);
        let accepting = taken == tokens.len() && m.is_accepting().unwrap_or(false);
        (taken, accepting)
    }

    /// Whether the grammar has ended the output (nothing but EOS can follow).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn error(&self, code: &'static str, e: impl std::fmt::Display) -> CoreError {
        CoreError::invalid(
            self.field.to_string(),
            code,
            format!("`{}`: the grammar failed: {e}", self.field),
        )
    }
}

/// The tokenizer as llguidance sees it: the trie of token bytes, and the tokenizer itself for
/// the text a grammar forces (without one, the trie's greedy longest-match tokenization).
struct TokenizerView {
    trie: TokTrie,
    detok: Option<Arc<Detokenizer>>,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match &self.detok {
            Some(detok) => detok
                .encode(&String::from_utf8_lossy(s), false)
                .unwrap_or_default(),
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one tokenizer, with a cache by kind and text. `Send + Sync`.
pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<VecDeque<((GrammarKind, String), Matcher)>>,
    vocab_size: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler for `detok`'s vocabulary; `eos_token_ids` end a constrained output (at least
    /// one).
    pub fn new(detok: Arc<Detokenizer>, eos_token_ids: &[TokenId]) -> CoreResult<Self> {
        let words: Vec<(Vec<u8>, bool)> = (0..detok.vocab_size() as TokenId)
            .map(|id| (detok.token_bytes(id), detok.is_special(id)))
            .collect();
        Self::build(&words, eos_token_ids, Some(detok))
    }

    /// A compiler for a vocabulary given as each id's bytes and whether it is special (forced
    /// text is tokenized greedily, longest match first); for benchmarks and tests.
    pub fn from_vocab(words: &[(Vec<u8>, bool)], eos_token_ids: &[TokenId]) -> CoreResult<Self> {
        Self::build(words, eos_token_ids, None)
    }

    fn build(
        vocab: &[(Vec<u8>, bool)],
        eos_token_ids: &[TokenId],
        detok: Option<Arc<Detokenizer>>,
    ) -> CoreResult<Self> {
        let Some(&eos) = eos_token_ids.first() else {
            return Err(CoreError::invalid(
                "eos_token_ids",
                "empty",
                "constrained decoding needs the model's EOS token id",
            ));
        };
        let num_ids = vocab.len();
        let words: Vec<Vec<u8>> = vocab
            .iter()
            .map(|(bytes, special)| {
                if !special && !bytes.is_empty() {
                    return bytes.clone();
                }
                // Special (and unused) ids: marked, so no grammar text can spell them.
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(bytes);
                w
            })
            .collect();
        let info = TokRxInfo::new(num_ids as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_token_ids);
        let env: TokEnv = Arc::new(TokenizerView { trie, detok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| {
            CoreError::invalid("tokenizer", "grammar_setup", format!("`tokenizer`: {e}"))
        })?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(GrammarCompiler {
            factory,
            cache: Mutex::new(VecDeque::new()),
            vocab_size: num_ids,
        })
    }

    /// Token ids the masks cover (ids at or beyond are never allowed).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The initial state of `spec`'s grammar, compiled (or cloned from the cache). Errors name
    /// `spec.field`: a source that does not parse, or one past the compile limits.
    pub fn compile(&self, spec: &GrammarSpec) -> CoreResult<GrammarState> {
        let key = (spec.kind.clone(), spec.text.clone());
        let field: Arc<str> = Arc::from(spec.field.as_str());
        if let Some(m) = self.cached(&key) {
            return Ok(GrammarState { matcher: m, field });
        }
        let bad = |code: &'static str, e: &dyn std::fmt::Display| {
            CoreError::invalid(spec.field.clone(), code, format!("`{}`: {e}", spec.field))
        };
        if spec.text.len() > MAX_GRAMMAR_BYTES {
            let msg = format!("is {} bytes; at most {MAX_GRAMMAR_BYTES}", spec.text.len());
            return Err(bad("too_long", &msg));
        }
        check_regex_sizes(spec).map_err(|e| bad("too_complex", &e))?;
        let grammar = top_level(spec).map_err(|e| bad("invalid_grammar", &e))?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| bad("invalid_grammar", &e))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask compiles the lexer's start; a grammar too costly to start fails here,
        // off the engine thread.
        if let Err(e) = matcher.compute_mask() {
            return Err(bad("invalid_grammar", &e));
        }
        let mut fresh = matcher.clone();
        fresh.reset().map_err(|e| bad("invalid_grammar", &e))?;
        self.remember(key, fresh);
        Ok(GrammarState { matcher, field })
    }

    fn cached(&self, key: &(GrammarKind, String)) -> Option<Matcher> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().find(|(k, _)| k == key).map(|(_, m)| m.clone())
    }

    fn remember(&self, key: (GrammarKind, String), matcher: Matcher) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.iter().any(|(k, _)| *k == key) {
            return;
        }
        if cache.len() >= CACHE_SIZE {
            cache.pop_front();
        }
        cache.push_back((key, matcher));
    }
}

/// llguidance's limits, tightened where a hostile grammar could take seconds: compiling the
/// lexer and each step's mask are bounded in work, the grammar in size.
fn limits() -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_lexer_states: 100_000,
        max_grammar_size: 200_000,
        ..ParserLimits::default()
    }
}

/// The most regex nodes a request's regex may expand to once its counted repetitions are
/// unrolled (`a{1000}` is 1,000): llguidance's lexer unrolls them, so nested counts built to
/// explode (`((a{1000}){1000}){1000}`, a billion) are refused before they cost seconds.
pub const MAX_REGEX_SIZE: u64 = 100_000;

/// Checks every regex of `spec` (the regex itself, a JSON schema's `pattern`s and
/// `patternProperties` keys, a Lark grammar's `/.../` terminals) against [`MAX_REGEX_SIZE`].
fn check_regex_sizes(spec: &GrammarSpec) -> Result<(), String> {
    let mut regexes: Vec<String> = Vec::new();
    match spec.kind {
        GrammarKind::Regex => regexes.push(spec.text.clone()),
        GrammarKind::JsonSchema => {
            if let Ok(schema) = serde_json::from_str::<serde_json::Value>(&spec.text) {
                schema_patterns(&schema, &mut regexes);
            }
        }
        GrammarKind::Lark => {
            regexes.extend(lark_terminals(&spec.text));
            for schema in lark_json_schemas(&spec.text) {
                schema_patterns(&schema, &mut regexes);
            }
        }
        GrammarKind::JsonObject | GrammarKind::Choice => {}
    }
    for rx in &regexes {
        // A pattern that does not parse here is left to llguidance, whose error names it.
        let Ok(hir) = regex_syntax::ParserBuilder::new().build().parse(rx) else {
            continue;
        };
        let size = expanded_size(&hir);
        if size > MAX_REGEX_SIZE {
            let shown: String = rx.chars().take(60).collect();
            return Err(format!(
                "the regex {shown:?} unrolls to about {size} nodes; at most {MAX_REGEX_SIZE} (lower its repetition counts)"
            ));
        }
    }
    Ok(())
}

fn schema_patterns(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x) {
                    ("pattern", serde_json::Value::String(p)) => out.push(p.clone()),
                    ("patternProperties", serde_json::Value::Object(props)) => {
                        out.extend(props.keys().cloned());
                        props.values().for_each(|p| schema_patterns(p, out));
                    }
                    _ => schema_patterns(x, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|x| schema_patterns(x, out)),
        _ => {}
    }
}

/// The JSON schemas a Lark grammar embeds with `%json { ... }` (tool-call grammars do).
fn lark_json_schemas(text: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("%json") {
        rest = &rest[at + "%json".len()..];
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        if let Some(Ok(schema)) = values.next() {
            out.push(schema);
        }
    }
    out
}

/// The `/.../` terminals of a Lark grammar (escaped slashes kept), roughly: enough to size them.
fn lark_terminals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '/' {
                continue;
            }
            let mut end = None;
            let mut escaped = false;
            for (j, d) in chars.by_ref() {
                match (escaped, d) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '/') => {
                        end = Some(j);
                        break;
                    }
                    _ => {}
                }
            }
            if let Some(j) = end {
                out.push(line[i + 1..j].to_string());
            }
        }
    }
    out
}

/// How many nodes `hir` is once counted repetitions are unrolled (an unbounded one counts its
/// minimum plus one).
fn expanded_size(hir: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => 1,
        HirKind::Capture(c) => expanded_size(&c.sub),
        HirKind::Repetition(r) => {
            let count = u64::from(r.max.unwrap_or(r.min.saturating_add(1)).max(1));
            expanded_size(&r.sub).saturating_mul(count)
        }
        HirKind::Concat(xs) | HirKind::Alternation(xs) => {
            xs.iter().map(expanded_size).fold(1u64, u64::saturating_add)
        }
    }
}

/// JSON output is compact-spaced (", " and ": ", no free whitespace): valid JSON, and a small
/// model cannot wander off into endless blank space.
fn json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

fn top_level(spec: &GrammarSpec) -> Result<TopLevelGrammar, String> {
    Ok(match spec.kind {
        GrammarKind::JsonObject => {
            let schema = serde_json::json!({"type": "object", "x-guidance": json_options()});
            TopLevelGrammar::from_json_schema(schema)
        }
        GrammarKind::JsonSchema => {
            let mut schema: serde_json::Value =
                serde_json::from_str(&spec.text).map_err(|e| format!("not JSON: {e}"))?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err("a JSON schema must be an object or a boolean".into());
            }
            if let Some(obj) = schema.as_object_mut() {
                obj.entry("x-guidance").or_insert_with(json_options);
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        GrammarKind::Regex => TopLevelGrammar::from_regex(&spec.text),
        GrammarKind::Lark => TopLevelGrammar::from_lark(spec.text.clone()),
        GrammarKind::Choice => {
            let choices: Vec<String> = serde_json::from_str(&spec.text)
                .map_err(|e| format!("not a list of strings: {e}"))?;
            if choices.is_empty() {
                return Err("must hold at least one choice".into());
            }
            let alternatives: Vec<String> = choices
                .iter()
                .map(|c| serde_json::to_string(c).expect("a string serializes"))
                .collect();
            TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
        }
    })
}
