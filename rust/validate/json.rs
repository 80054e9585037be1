//! A request body's bytes into the `Raw` value `validate` reads, in one pass: JSON syntax,
//! duplicate keys (JSON leaves them undefined, so a proxy in front of the server might read a
//! different request than the server would: refused, naming the key), nesting depth, and a body
//! that is not an object are all decided while the bytes are read. The HTTP routes hand their
//! body here; nothing else walks it.

use std::fmt;

use rustc_hash::FxHashMap;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::CoreError;

use super::raw::Raw;

/// Deepest nesting accepted in a body; real request bodies are a few levels deep, and the limit
/// keeps a hostile value from exhausting the stack.
pub const MAX_DEPTH: usize = 64;

/// The `param` of an error about the body as a whole (no one field is at fault): empty, which
/// the server reports as no `param`.
pub const WHOLE_BODY: &str = "";
/// The `code` of a body that is not valid JSON (or empty, or nested past any limit).
pub const INVALID_JSON: &str = "invalid_json";
/// The `code` of an object that names a key twice.
pub const DUPLICATE_KEY: &str = "duplicate_key";

/// One step of the path to a value, for error messages.
#[derive(Debug, Clone)]
pub enum Seg {
    /// An object member.
    Key(String),
    /// A list element.
    Index(usize),
}

/// Formats a path the way `validate` names fields (`messages[0].content`; a top-level list
/// element is `body[i]`).
pub fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) if out.is_empty() => out.push_str(&format!("body[{i}]")),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() {
        out.push_str("body");
    }
    out
}

/// The error for a value nested past [`MAX_DEPTH`], naming its path.
pub fn too_deep(path: &[Seg]) -> CoreError {
    let param = path_string(path);
    let message = format!("`{param}` is nested more than {MAX_DEPTH} levels deep");
    CoreError::invalid(param, super::codes::INVALID_FORMAT, message)
}

/// Parses a request body: a JSON object, every key unique within its object, at most
/// [`MAX_DEPTH`] levels deep. Errors are `CoreError::Invalid` with code [`INVALID_JSON`]
/// (malformed or empty), `wrong_type` (not an object), [`DUPLICATE_KEY`] (param: the key) or
/// `invalid_format` (too deep, param: its path).
pub fn parse_body(bytes: &[u8]) -> Result<Raw, CoreError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(invalid_json(
            "the request body is empty; send a JSON object",
        ));
    }
    let mut state = State::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // The depth limit is ours (and lower), so serde_json's own recursion guard never trips first.
    let parsed = RawSeed { st: &mut state }
        .deserialize(&mut de)
        .and_then(|raw| de.end().map(|()| raw));
    let raw = match (parsed, state.error) {
        (_, Some(error)) => return Err(error),
        (Err(e), None) => {
            return Err(invalid_json(format!(
                "the request body is not valid JSON: {e}"
            )))
        }
        (Ok(raw), None) => raw,
    };
    match raw {
        Raw::Map(_) => Ok(raw),
        other => Err(CoreError::invalid(
            WHOLE_BODY,
            super::codes::WRONG_TYPE,
            format!(
                "the request body must be a JSON object; got {}",
                python_type_name(&other)
            ),
        )),
    }
}

/// Any JSON value (a tool call's `arguments` string, say), as Python's `json.loads` reads it:
/// a repeated key keeps its last value; None when `text` is not JSON or is nested past
/// [`MAX_DEPTH`].
pub fn parse_value(text: &str) -> Option<Raw> {
    let mut state = State {
        lenient: true,
        ..State::default()
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let raw = RawSeed { st: &mut state }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(raw)
}

fn invalid_json(message: impl Into<String>) -> CoreError {
    CoreError::invalid(WHOLE_BODY, INVALID_JSON, message.into())
}

/// What Python calls a value of this shape (the messages name types as clients see them).
fn python_type_name(raw: &Raw) -> &'static str {
    match raw {
        Raw::Null => "NoneType",
        Raw::Bool(_) => "bool",
        Raw::Int(_) => "int",
        Raw::Float(_) => "float",
        Raw::Str(_) => "str",
        Raw::List(_) => "list",
        Raw::Map(_) => "dict",
    }
}

/// The parse's position and the first error of ours (serde's own errors carry no field).
#[derive(Default)]
struct State {
    path: Vec<Seg>,
    error: Option<CoreError>,
    /// A repeated key replaces the earlier value instead of failing (`parse_value`).
    lenient: bool,
}

impl State {
    fn fail<E: de::Error>(&mut self, error: CoreError) -> E {
        let message = error.to_string();
        self.error.get_or_insert(error);
        E::custom(message)
    }
}

struct RawSeed<'s> {
    st: &'s mut State,
}

impl<'de> DeserializeSeed<'de> for RawSeed<'_> {
    type Value = Raw;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        if self.st.path.len() > MAX_DEPTH {
            let error = too_deep(&self.st.path);
            return Err(self.st.fail(error));
        }
        d.deserialize_any(RawVisitor { st: self.st })
    }
}

struct RawVisitor<'s> {
    st: &'s mut State,
}

impl<'de> Visitor<'de> for RawVisitor<'_> {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Int(i128::from(v)))
    }

    /// A number with a fraction or exponent, or an integer beyond 64 bits (which no field
    /// takes: the integer fields refuse a float that is not exact).
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        loop {
            self.st.path.push(Seg::Index(items.len()));
            let item = seq.next_element_seed(RawSeed { st: self.st })?;
            self.st.path.pop();
            match item {
                Some(item) => items.push(item),
                None => return Ok(Raw::List(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries: Vec<(String, Raw)> = Vec::new();
        // Key -> its entry: a set would do for refusing duplicates, the index lets a lenient
        // parse replace the value, both without a scan per key.
        let mut seen: FxHashMap<String, usize> = FxHashMap::default();
        while let Some(key) = map.next_key::<String>()? {
            let earlier = seen.get(&key).copied();
            if earlier.is_some() && !self.st.lenient {
                let message = format!(
                    "`{key}`: the key appears twice in one JSON object; keys must be unique"
                );
                return Err(self
                    .st
                    .fail(CoreError::invalid(key, DUPLICATE_KEY, message)));
            }
            self.st.path.push(Seg::Key(key.clone()));
            let value = map.next_value_seed(RawSeed { st: self.st })?;
            self.st.path.pop();
            match earlier {
                Some(i) => entries[i].1 = value,
                None => {
                    seen.insert(key.clone(), entries.len());
                    entries.push((key, value));
                }
            }
        }
        Ok(Raw::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> (String, String, String) {
        match parse_body(body.as_bytes()).unwrap_err() {
            CoreError::Invalid {
                param,
                code,
                message,
            } => (param, code.to_string(), message),
            other => panic!("not a validation error: {other:?}"),
        }
    }

    #[test]
    fn a_body_parses_into_raw_in_order_with_exact_integers() {
        let raw = parse_body(
            br#"{"b": [1, -2, 18446744073709551615], "a": {"x": null, "y": 1.5}, "s": "\u00e9"}"#,
        )
        .unwrap();
        let Raw::Map(entries) = raw else { panic!() };
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "s"]);
        assert_eq!(
            entries[0].1,
            Raw::List(vec![Raw::Int(1), Raw::Int(-2), Raw::Int(u64::MAX.into())])
        );
        assert_eq!(entries[2].1, Raw::Str("é".into()));
    }

    #[test]
    fn a_duplicate_key_is_refused_naming_it_at_any_depth() {
        let (param, code, message) =
            err(r#"{"messages": [{"role": "user", "content": "a", "content": "b"}]}"#);
        assert_eq!((param.as_str(), code.as_str()), ("content", DUPLICATE_KEY));
        assert!(
            message.contains("`content`: the key appears twice"),
            "{message}"
        );
        // The same key in different objects is fine.
        assert!(parse_body(br#"{"a": {"k": 1}, "b": {"k": 2}}"#).is_ok());
    }

    #[test]
    fn bad_bodies_name_what_is_wrong() {
        assert_eq!(err("").1, INVALID_JSON);
        assert!(err("  ").2.contains("empty"));
        let (_, code, message) = err(r#"{"a": 1,}"#);
        assert_eq!(code, INVALID_JSON);
        assert!(
            message.starts_with("the request body is not valid JSON: "),
            "{message}"
        );
        let (_, code, message) = err("[1, 2]");
        assert_eq!(code, "wrong_type");
        assert!(message.ends_with("got list"), "{message}");
        assert_eq!(err(r#"{"a": 1} x"#).1, INVALID_JSON); // trailing characters
        assert_eq!(err(r#"{"s": "\ud800"}"#).1, INVALID_JSON); // a lone surrogate
    }

    #[test]
    fn nesting_past_the_limit_names_its_path() {
        let deep = format!("{{\"prompt\": {}{}}}", "[".repeat(70), "]".repeat(70));
        let (param, code, message) = err(&deep);
        assert_eq!(code, "invalid_format");
        assert!(param.starts_with("prompt[0][0]"), "{param}");
        assert!(
            message.contains("nested more than 64 levels deep"),
            "{message}"
        );
        let hostile = format!(
            "{{\"prompt\": {}{}}}",
            "[".repeat(20_000),
            "]".repeat(20_000)
        );
        assert_eq!(err(&hostile).1, "invalid_format"); // no stack overflow
    }
}
