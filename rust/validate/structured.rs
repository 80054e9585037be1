//! Structured output: the one grammar a request may constrain its output with, from OpenAI's
//! `response_format` (`json_object`, `json_schema`; `/v1` chat and completions, Databricks
//! chat) or vLLM's extras on `/v1` (`guided_json`, `guided_regex`, `guided_choice`,
//! `guided_grammar`, and `structured_outputs` holding one of `json`, `regex`, `choice`,
//! `grammar`, `json_object`). Asking for two is a conflict naming the second. The grammar's
//! source is checked for shape here; compiling it (and its limits) is `grammar`'s work, whose
//! errors name the same field.

use super::codes;
use super::raw::{Field, Obj, Raw};
use super::trt::scalar;
use super::Route;
use crate::error::CoreResult;
use crate::grammar::{GrammarKind, GrammarSpec};

/// The grammar `o` asks for on `route`, if any.
pub(crate) fn structured_output(route: Route, o: &Obj<'_>) -> CoreResult<Option<GrammarSpec>> {
    let mut found: Option<GrammarSpec> = None;
    let mut take = |f: &Field<'_>, spec: Option<GrammarSpec>| -> CoreResult<()> {
        match (spec, &found) {
            (Some(_), Some(first)) => Err(f.bad(
                codes::CONFLICT,
                format_args!(
                    "cannot be used with `{}` (one grammar per request)",
                    first.field
                ),
            )),
            (Some(spec), None) => {
                found = Some(spec);
                Ok(())
            }
            (None, _) => Ok(()),
        }
    };
    // Only where the API has it: on another route it is an unknown field, ignored as every
    // unknown field is (docs/api/common.md#request-bodies), never read and then dropped.
    if matches!(
        route,
        Route::Chat | Route::Completions | Route::DatabricksChat
    ) {
        let rf = o.field("response_format");
        take(&rf, response_format(&rf)?)?;
    }
    if matches!(route, Route::Chat | Route::Completions) {
        for key in [
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        ] {
            let f = o.field(key);
            take(&f, guided(&f, key)?)?;
        }
        let so = o.field("structured_outputs");
        take(&so, structured_outputs(&so)?)?;
    }
    if route == Route::Trt {
        let guide = o.field("guided_decoding_guide_type");
        take(&guide, trt_guide(o)?)?;
    }
    Ok(found)
}

/// The TensorRT-LLM backend's string tensors `guided_decoding_guide_type` ("json",
/// "json_schema", "regex", "lark"; TRT's "ebnf_grammar" and "structural_tag" are refused)
/// and `guided_decoding_guide` (the schema, regex or grammar; none for "json").
fn trt_guide(o: &Obj<'_>) -> CoreResult<Option<GrammarSpec>> {
    const TYPE: &str = "guided_decoding_guide_type";
    let (ty_field, guide_field) = (o.field(TYPE), o.field("guided_decoding_guide"));
    let ty = scalar(ty_field)?.str()?;
    let guide = scalar(guide_field)?.str()?;
    let Some(ty) = ty else {
        if guide.is_some() {
            return Err(guide_field.bad(codes::CONFLICT, format_args!("needs `{TYPE}`")));
        }
        return Ok(None);
    };
    let needs_guide = |what: &str| match guide.filter(|g| !g.is_empty()) {
        Some(g) => Ok(g.to_string()),
        None => Err(guide_field.bad(
            codes::MISSING,
            format_args!("must hold the {what} when `{TYPE}` is {ty:?}"),
        )),
    };
    let (kind, text) = match ty {
        "json" => {
            if guide.is_some_and(|g| !g.is_empty()) {
                return Err(guide_field.bad(
                    codes::CONFLICT,
                    format_args!("must be absent when `{TYPE}` is \"json\" (any JSON object)"),
                ));
            }
            (GrammarKind::JsonObject, String::new())
        }
        "json_schema" => {
            let text = needs_guide("JSON schema")?;
            let raw = Raw::Str(text);
            (
                GrammarKind::JsonSchema,
                json_schema_text(&guide_field, &raw)?,
            )
        }
        "regex" => (GrammarKind::Regex, needs_guide("regular expression")?),
        "lark" => (GrammarKind::Lark, needs_guide("Lark grammar")?),
        "ebnf_grammar" | "structural_tag" => {
            return Err(ty_field.bad(
                codes::UNSUPPORTED,
                format_args!(
                "{ty:?} is not supported; send the grammar as \"lark\" (llguidance's Lark dialect)"
            ),
            ))
        }
        _ => {
            return Err(ty_field.bad(
                codes::INVALID_VALUE,
                "must be \"json\", \"json_schema\", \"regex\" or \"lark\"",
            ))
        }
    };
    Ok(spec(kind, text, TYPE))
}

fn spec(kind: GrammarKind, text: String, field: &str) -> Option<GrammarSpec> {
    Some(GrammarSpec {
        kind,
        text,
        field: field.to_string(),
    })
}

/// OpenAI `response_format` (its shape was checked by `tools::response_format`).
fn response_format(f: &Field<'_>) -> CoreResult<Option<GrammarSpec>> {
    let Some(obj) = f.obj()? else {
        return Ok(None);
    };
    Ok(match obj.field("type").str()? {
        Some("json_object") => spec(GrammarKind::JsonObject, String::new(), "response_format"),
        Some("json_schema") => {
            let schema = obj.field("json_schema");
            let text = match schema.obj()? {
                Some(s) => s.field("schema").raw.map(|r| r.to_json().to_string()),
                None => None,
            };
            text.and_then(|t| spec(GrammarKind::JsonSchema, t, "response_format"))
        }
        _ => None,
    })
}

/// One of vLLM's `guided_*` fields.
fn guided(f: &Field<'_>, key: &str) -> CoreResult<Option<GrammarSpec>> {
    let Some(raw) = f.raw.filter(|r| !matches!(r, Raw::Null)) else {
        return Ok(None);
    };
    let (kind, text) = match key {
        "guided_json" => (GrammarKind::JsonSchema, json_schema_text(f, raw)?),
        "guided_regex" => (GrammarKind::Regex, non_empty(f)?),
        "guided_grammar" => (GrammarKind::Lark, non_empty(f)?),
        _ => (GrammarKind::Choice, choices(f)?),
    };
    Ok(spec(kind, text, key))
}

/// vLLM's `structured_outputs`: an object holding exactly one constraint.
fn structured_outputs(f: &Field<'_>) -> CoreResult<Option<GrammarSpec>> {
    let Some(obj) = f.obj()? else {
        return Ok(None);
    };
    let mut found: Vec<GrammarSpec> = Vec::new();
    for (key, kind) in [
        ("json", GrammarKind::JsonSchema),
        ("regex", GrammarKind::Regex),
        ("choice", GrammarKind::Choice),
        ("grammar", GrammarKind::Lark),
    ] {
        let g = obj.field(key);
        let Some(raw) = g.raw.filter(|r| !matches!(r, Raw::Null)) else {
            continue;
        };
        let text = match kind {
            GrammarKind::JsonSchema => json_schema_text(&g, raw)?,
            GrammarKind::Choice => choices(&g)?,
            _ => non_empty(&g)?,
        };
        found.extend(spec(kind, text, &format!("structured_outputs.{key}")));
    }
    if obj.field("json_object").bool()? == Some(true) {
        found.extend(spec(
            GrammarKind::JsonObject,
            String::new(),
            "structured_outputs.json_object",
        ));
    }
    match found.len() {
        0 => Err(f.bad(
            codes::MISSING,
            "must hold one of `json`, `regex`, `choice`, `grammar` or `json_object: true`",
        )),
        1 => Ok(found.pop()),
        _ => Err(f.bad(codes::CONFLICT, "must hold only one constraint")),
    }
}

/// A JSON schema given as an object (or as a string holding one, as vLLM accepts).
fn json_schema_text(f: &Field<'_>, raw: &Raw) -> CoreResult<String> {
    match raw {
        Raw::Map(_) | Raw::Bool(_) => Ok(raw.to_json().to_string()),
        Raw::Str(s) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(v) if v.is_object() || v.is_boolean() => Ok(v.to_string()),
            _ => Err(f.bad(codes::INVALID_FORMAT, "must be a JSON schema (an object)")),
        },
        _ => Err(f.wrong_type("a JSON schema (an object)")),
    }
}

fn non_empty(f: &Field<'_>) -> CoreResult<String> {
    match f.str()? {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(f.bad(codes::EMPTY, "must be a non-empty string")),
    }
}

/// `guided_choice`: a non-empty list of strings, kept as a JSON array.
fn choices(f: &Field<'_>) -> CoreResult<String> {
    let items = f.list()?.unwrap_or(&[]);
    if items.is_empty() {
        return Err(f.bad(codes::EMPTY, "must be a non-empty list of strings"));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Raw::Str(s) => out.push(serde_json::Value::String(s.clone())),
            _ => return Err(f.bad(codes::WRONG_TYPE, "must be a list of strings")),
        }
    }
    Ok(serde_json::Value::Array(out).to_string())
}
