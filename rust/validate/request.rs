//! `ValidRequest`: what one validation pass over a request body yields. It holds the
//! normalised [`SamplingParams`] and every route switch a handler needs (stream, echo, suffix,
//! error_behavior, details, the client id, ...). The rules that need the prompt's token count
//! (the prompt-token limit (docs/api/common.md#prompt-limits) and the output cap
//! (docs/api/common.md#output-cap)) are one cheap call on it after tokenizing,
//! [`ValidRequest::fit_prompt`], with no second pass over the body.

use crate::error::CoreResult;
use crate::grammar::GrammarSpec;
use crate::params::SamplingParams;

use super::common::{apply_output_cap, is_token_id_list};
use super::limits::{check_prompt_tokens_of, max_prompt_tokens, Limits};
use super::raw::{Obj, Raw};
use super::structured::structured_output;
use super::Route;

/// How the output cap (docs/api/common.md#output-cap) applies once the prompt's token count is
/// known.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutputCap {
    /// The route's rule: `requested` is the client's cap or the route default (None where the
    /// route has none); a prompt-limit error names `prompt_field`.
    Route {
        requested: Option<u64>,
        prompt_field: &'static str,
    },
    /// The offline route: `max_tokens` stays as given unless a count is known.
    WithCountOnly { requested: Option<u64> },
    /// Already applied during validation (the TRT route counts its own `input_ids`).
    Applied,
    /// Only the prompt-token limit (nothing is generated: embeddings).
    LimitOnly { prompt_field: &'static str },
}

/// The route switches that are not sampling parameters, read once by validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Switches {
    /// Stream the response as server-sent events.
    pub stream: bool,
    /// The `model` the client named (`/v1` routes).
    pub model: Option<String>,
    /// Completions `echo`: the prompt is put before the generated text.
    pub echo: bool,
    /// Completions `suffix` (text after the completion).
    pub suffix: Option<String>,
    /// Databricks `error_behavior: "truncate"`: a prompt over the token limit is cut from
    /// the left instead of refused.
    pub truncate: bool,
    /// MindIE `parameters.details`.
    pub details: bool,
    /// MindIE client request `id`.
    pub client_id: Option<String>,
    /// Whether the body names any tool.
    pub has_tools: bool,
    /// `tool_choice` when it is a string (`"none"`, `"auto"`, `"required"`).
    pub tool_choice: Option<String>,
    /// Whether `tool_choice` names one function (an object).
    pub forces_tool: bool,
    /// `response_format.type`, when given.
    pub response_format: Option<String>,
    /// Whether `prompt` (or `input`) is a list of prompts: a batch (a list of token ids is
    /// one prompt).
    pub is_batch: bool,
    /// Completions `max_tokens: 0` with `echo`: the prompt is scored, nothing is returned of
    /// the one token generated.
    pub score_only: bool,
    /// vLLM's `prompt_logprobs` extra as the client sent it: the response's `prompt_logprobs`
    /// field, with this many alternatives per token.
    pub prompt_logprobs: Option<u32>,
    /// Structured output: the grammar the output must follow (`response_format`, vLLM's
    /// `guided_*` / `structured_outputs`); compiled by `grammar::GrammarCompiler`.
    pub grammar: Option<GrammarSpec>,
    /// `/v1/embeddings` `encoding_format: "base64"` (else float).
    pub base64: bool,
    /// `/v1/embeddings` `truncate_prompt_tokens`, resolved (-1 is the model's maximum): inputs
    /// are cut to this many tokens before the limits apply.
    pub truncate_prompt_tokens: Option<u32>,
}

/// A request body that passed its route's rules: the parameters and the switches.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    /// The route it was validated for.
    pub route: Route,
    /// The parameters before the prompt-token rules: `max_tokens` is capped by
    /// `max_iter_times` only (the offline route leaves it as given).
    pub params: SamplingParams,
    /// The route switches.
    pub switches: Switches,
    pub(crate) cap: OutputCap,
}

impl ValidRequest {
    /// Builds a request from a route's parameters, applying the count-free part of the cap.
    pub(crate) fn new(
        route: Route,
        mut params: SamplingParams,
        switches: Switches,
        cap: OutputCap,
        limits: &Limits,
    ) -> CoreResult<Self> {
        if let OutputCap::Route {
            requested,
            prompt_field,
        } = &cap
        {
            apply_output_cap(&mut params, *requested, None, prompt_field, limits)?;
        }
        Ok(ValidRequest {
            route,
            params,
            switches,
            cap,
        })
    }

    /// The parameters for a prompt of `num_prompt_tokens` tokens (after the chat template, for
    /// chat): the prompt-token limit (docs/api/common.md#prompt-limits) and the output cap
    /// (docs/api/common.md#output-cap). `index` is the prompt's place in a batch, named in errors
    /// (`prompt[2]`). Without a count the parameters are returned as they are.
    pub fn with_prompt_tokens(
        &self,
        num_prompt_tokens: Option<u32>,
        index: Option<usize>,
        limits: &Limits,
    ) -> CoreResult<SamplingParams> {
        let mut p = self.params.clone();
        // The cap is for the prompt as the engine gets it: cut, under truncation.
        let num_prompt_tokens = num_prompt_tokens.map(|n| self.kept_tokens(n, limits));
        match (&self.cap, num_prompt_tokens) {
            (_, None) | (OutputCap::Applied, _) => {}
            (
                OutputCap::Route { requested, .. } | OutputCap::WithCountOnly { requested },
                n @ Some(_),
            ) => {
                let field = self.prompt_param(index);
                apply_output_cap(&mut p, *requested, n, &field, limits)?;
            }
            (OutputCap::LimitOnly { .. }, Some(n)) => {
                check_prompt_tokens_of(&self.prompt_param(index), n, limits)?;
            }
        }
        Ok(p)
    }

    /// Fits a tokenized prompt of `num_tokens` tokens: with `truncate` set, a prompt over the
    /// limit keeps its last [`max_prompt_tokens`] tokens (docs/decisions.md#what-truncate-does);
    /// then [`ValidRequest::with_prompt_tokens`]. Returns how many leading tokens to drop and the
    /// parameters.
    pub fn fit_prompt(
        &self,
        num_tokens: usize,
        index: Option<usize>,
        limits: &Limits,
    ) -> CoreResult<(usize, SamplingParams)> {
        let num = u32::try_from(num_tokens).unwrap_or(u32::MAX);
        let kept = self.kept_tokens(num, limits);
        let drop = num_tokens - kept as usize;
        Ok((drop, self.with_prompt_tokens(Some(kept), index, limits)?))
    }

    /// How many of a prompt's `num_tokens` tokens the engine gets: all of them, or under
    /// `error_behavior: "truncate"` at most [`max_prompt_tokens`] (the last ones,
    /// docs/decisions.md#what-truncate-does).
    fn kept_tokens(&self, num_tokens: u32, limits: &Limits) -> u32 {
        match self.switches.truncate {
            true => num_tokens.min(max_prompt_tokens(limits)),
            false => num_tokens,
        }
    }

    /// The prompt field as errors name it: `prompt`, or `prompt[i]` in a batch.
    fn prompt_param(&self, index: Option<usize>) -> String {
        let field = match &self.cap {
            OutputCap::Route { prompt_field, .. } | OutputCap::LimitOnly { prompt_field } => {
                prompt_field
            }
            _ => "prompt",
        };
        match index {
            Some(i) if self.switches.is_batch => format!("{field}[{i}]"),
            _ => field.to_string(),
        }
    }
}

/// A request of a route whose output cap follows docs/api/common.md#output-cap (`requested`: the
/// client's cap or the route default; a prompt-limit error names `prompt_field`).
pub(crate) fn routed(
    route: Route,
    body: &Raw,
    params: SamplingParams,
    requested: Option<u64>,
    prompt_field: &'static str,
    limits: &Limits,
) -> CoreResult<ValidRequest> {
    let cap = OutputCap::Route {
        requested,
        prompt_field,
    };
    ValidRequest::new(route, params, read_switches(route, body)?, cap, limits)
}

/// Reads the route switches of a body that already passed its route's rules (so every read
/// here has been type-checked once, and none can fail).
pub(crate) fn read_switches(route: Route, body: &Raw) -> CoreResult<Switches> {
    let o = Obj::root(body)?;
    let params = o.field("parameters").obj()?;
    let string =
        |key: &str| -> CoreResult<Option<String>> { Ok(o.field(key).str()?.map(str::to_owned)) };
    let tool_choice = o.field("tool_choice");
    let is_batch =
        |key: &str| matches!(body.get(key), Some(Raw::List(items)) if !is_token_id_list(items));
    Ok(Switches {
        stream: o.field("stream").bool()?.unwrap_or(false),
        model: string("model")?,
        echo: o.field("echo").bool()?.unwrap_or(false),
        suffix: string("suffix")?,
        truncate: route == Route::DatabricksCompletions
            && o.field("error_behavior").str()? == Some("truncate"),
        details: match params {
            Some(q) => q.field("details").bool()?.unwrap_or(false),
            None => false,
        },
        client_id: match route {
            Route::Generate => string("id")?,
            _ => None,
        },
        has_tools: o.field("tools").list()?.is_some_and(|t| !t.is_empty()),
        tool_choice: match tool_choice.raw {
            Some(Raw::Str(s)) => Some(s.clone()),
            _ => None,
        },
        forces_tool: matches!(tool_choice.raw, Some(Raw::Map(_))),
        response_format: match o.field("response_format").obj()? {
            Some(rf) => rf.field("type").str()?.map(str::to_owned),
            None => None,
        },
        is_batch: is_batch("prompt") || is_batch("input"),
        score_only: route == Route::Completions
            && o.field("echo").bool()? == Some(true)
            && o.field("max_tokens").int()? == Some(0),
        prompt_logprobs: match route {
            Route::Chat | Route::Completions => o
                .field("prompt_logprobs")
                .int()?
                .map(|k| u32::try_from(k).unwrap_or(u32::MAX)),
            _ => None,
        },
        grammar: structured_output(route, &o)?,
        base64: false,
        truncate_prompt_tokens: None,
    })
}
