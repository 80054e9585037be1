//! The request value `validate` reads (`Raw`: a decoded JSON body or a Python object tree), the
//! field paths that errors name, and typed getters that apply docs/api/common.md#request-bodies
//! once for every route: JSON null is the same as absent, types are strict (integer fields take no
//! strings, bools or fractions; float fields take integers; bool fields take only bools).

use std::fmt::{self, Write as _};

use crate::error::CoreError;

use super::codes;

/// A decoded request value: the shape of JSON, with integers kept exact (`i128` holds every
/// `u64` seed and every `i64`) so that precision is never lost before a range check.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// JSON `null` / Python `None`: treated as absent wherever a field is optional.
    Null,
    /// JSON `true` / `false`.
    Bool(bool),
    /// An integral JSON number or Python `int`.
    Int(i128),
    /// A JSON number with a fraction or exponent, or a Python `float`.
    Float(f64),
    /// A string.
    Str(String),
    /// A JSON array / Python list or tuple.
    List(Vec<Raw>),
    /// A JSON object / Python dict, in the order the client wrote it.
    Map(Vec<(String, Raw)>),
}

/// Largest magnitude at which every integer is exactly representable as an `f64` (2^53).
const MAX_EXACT_FLOAT_INT: f64 = 9_007_199_254_740_992.0;

/// How many characters of a value an error message quotes before it cuts with "...".
const MAX_QUOTED_CHARS: usize = 80;

impl Raw {
    /// The value under `key` when `self` is a map (the last one if the key repeats, as JSON
    /// decoders do); `None` for other variants.
    pub fn get(&self, key: &str) -> Option<&Raw> {
        match self {
            Raw::Map(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as JSON (a non-finite float becomes null, as JSON has none).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Raw::Null => Value::Null,
            Raw::Bool(b) => Value::Bool(*b),
            Raw::Int(i) => match i64::try_from(*i) {
                Ok(v) => Value::from(v),
                Err(_) => Value::from(*i as f64),
            },
            Raw::Float(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
            Raw::Str(s) => Value::String(s.clone()),
            Raw::List(items) => Value::Array(items.iter().map(Raw::to_json).collect()),
            Raw::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The JSON type of the value, with an article, for "must be X; got Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Bool(_) => "a boolean",
            Raw::Int(_) => "an integer",
            Raw::Float(_) => "a number",
            Raw::Str(_) => "a string",
            Raw::List(_) => "a list",
            Raw::Map(_) => "an object",
        }
    }

    /// Writes compact JSON into `out`, stopping once `out` is longer than `budget` bytes so
    /// that a huge or deeply nested value costs no more than the quote it ends up in.
    fn render(&self, out: &mut String, budget: usize) {
        if out.len() > budget {
            return;
        }
        match self {
            Raw::Null => out.push_str("null"),
            Raw::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Raw::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Raw::Float(x) => {
                let _ = write!(out, "{x:?}");
            }
            Raw::Str(s) => {
                let _ = write!(out, "{s:?}");
            }
            Raw::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.render(out, budget);
                    if out.len() > budget {
                        return;
                    }
                }
                out.push(']');
            }
            Raw::Map(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{k:?}: ");
                    v.render(out, budget);
                    if out.len() > budget {
                        return;
                    }
                }
                out.push('}');
            }
        }
    }
}

impl fmt::Display for Raw {
    /// Compact JSON, cut to about 80 characters: the form error messages quote values in.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        self.render(&mut out, MAX_QUOTED_CHARS);
        if out.len() > MAX_QUOTED_CHARS {
            let cut = (0..=MAX_QUOTED_CHARS)
                .rev()
                .find(|&i| out.is_char_boundary(i))
                .unwrap_or(0);
            out.truncate(cut);
            out.push_str("...");
        }
        f.write_str(&out)
    }
}

/// Where a field sits in the body, as the client wrote it (`messages[2].content[1].type`).
/// A linked list on the stack: building one costs nothing, and it is turned into a string
/// only when an error names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Path<'a> {
    /// The body itself.
    Root,
    /// A member of an object.
    Key(&'a Path<'a>, &'a str),
    /// An element of a list.
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    /// The path of member `key` of the object at `self`.
    pub(crate) fn key(&'a self, key: &'a str) -> Path<'a> {
        Path::Key(self, key)
    }

    /// The path of element `index` of the list at `self`.
    pub(crate) fn index(&'a self, index: usize) -> Path<'a> {
        Path::Index(self, index)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("body"),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// An error on the field at `path`: the message starts with the path in backticks and goes on
/// with `rule` ("must be in (0, 1]; got 1.5").
pub(crate) fn fail(path: Path<'_>, code: &'static str, rule: impl fmt::Display) -> CoreError {
    let param = path.to_string();
    let message = format!("`{param}` {rule}");
    CoreError::invalid(param, code, message)
}

/// One field of the body: where it is, and its value unless it was absent or null.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field<'a> {
    pub(crate) path: Path<'a>,
    pub(crate) raw: Option<&'a Raw>,
}

impl<'a> Field<'a> {
    /// A field at `path` holding `raw`; JSON null counts as absent.
    pub(crate) fn new(path: Path<'a>, raw: Option<&'a Raw>) -> Self {
        let raw = raw.filter(|r| !matches!(r, Raw::Null));
        Field { path, raw }
    }

    /// True when the field is present and not null.
    pub(crate) fn is_set(&self) -> bool {
        self.raw.is_some()
    }

    /// The error for a required field that is absent or null.
    pub(crate) fn missing(&self) -> CoreError {
        fail(self.path, codes::MISSING, "is required")
    }

    /// The error for a value of the wrong JSON type; `want` is "an integer", "a string", ...
    pub(crate) fn wrong_type(&self, want: &str) -> CoreError {
        let got = self
            .raw
            .map_or("null".to_string(), |r| format!("{} {r}", r.kind()));
        fail(
            self.path,
            codes::WRONG_TYPE,
            format!("must be {want}; got {got}"),
        )
    }

    /// The error for a present value that breaks `rule`; the message ends with the value.
    pub(crate) fn bad(&self, code: &'static str, rule: impl fmt::Display) -> CoreError {
        let got = self.raw.map_or("null".to_string(), |r| r.to_string());
        fail(self.path, code, format!("{rule}; got {got}"))
    }

    /// A boolean: only `true` or `false`.
    pub(crate) fn bool(&self) -> Result<Option<bool>, CoreError> {
        match self.raw {
            None => Ok(None),
            Some(Raw::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong_type("a boolean (true or false)")),
        }
    }

    /// An exact integer. A float is accepted only when it is integral and at most 2^53 in
    /// magnitude (where a JSON double still names one integer); strings and bools are not.
    pub(crate) fn int(&self) -> Result<Option<i128>, CoreError> {
        match self.raw {
            None => Ok(None),
            Some(Raw::Int(i)) => Ok(Some(*i)),
            Some(Raw::Float(x)) if x.fract() == 0.0 && x.abs() <= MAX_EXACT_FLOAT_INT => {
                Ok(Some(*x as i128))
            }
            Some(_) => Err(self.wrong_type("an integer")),
        }
    }

    /// A finite number that fits an `f32` (every float field is stored as one); integers are
    /// accepted.
    pub(crate) fn float(&self) -> Result<Option<f64>, CoreError> {
        let x = match self.raw {
            None => return Ok(None),
            Some(Raw::Int(i)) => *i as f64,
            Some(Raw::Float(x)) => *x,
            Some(_) => return Err(self.wrong_type("a number")),
        };
        if !x.is_finite() || x.abs() > f64::from(f32::MAX) {
            return Err(self.bad(codes::OUT_OF_RANGE, "must be a finite number"));
        }
        Ok(Some(x))
    }

    /// A string.
    pub(crate) fn str(&self) -> Result<Option<&'a str>, CoreError> {
        match self.raw {
            None => Ok(None),
            Some(Raw::Str(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong_type("a string")),
        }
    }

    /// A list.
    pub(crate) fn list(&self) -> Result<Option<&'a [Raw]>, CoreError> {
        match self.raw {
            None => Ok(None),
            Some(Raw::List(items)) => Ok(Some(items)),
            Some(_) => Err(self.wrong_type("a list")),
        }
    }

    /// An object, viewed with this field's path so that its members name themselves.
    pub(crate) fn obj(&self) -> Result<Option<Obj<'a>>, CoreError> {
        match self.raw {
            None => Ok(None),
            Some(Raw::Map(entries)) => Ok(Some(Obj {
                path: self.path,
                entries,
            })),
            Some(_) => Err(self.wrong_type("an object")),
        }
    }
}

/// An object of the body together with its path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Obj<'a> {
    pub(crate) path: Path<'a>,
    pub(crate) entries: &'a [(String, Raw)],
}

impl<'a> Obj<'a> {
    /// The whole body, which must be an object.
    pub(crate) fn root(body: &'a Raw) -> Result<Obj<'a>, CoreError> {
        Field::new(Path::Root, Some(body))
            .obj()?
            .ok_or_else(|| Field::new(Path::Root, None).wrong_type("an object"))
    }

    /// Member `key` (absent and null both read as unset).
    pub(crate) fn field<'b>(&'b self, key: &'b str) -> Field<'b>
    where
        'a: 'b,
    {
        let raw = self.entries.iter().rev().find(|(k, _)| k == key);
        Field::new(self.path.key(key), raw.map(|(_, v)| v))
    }

    /// Every member as a field, in body order, in one pass: calling `field` per key would
    /// scan the object once per member, quadratic in a 50,000-key schema. (Keys are unique:
    /// `decode_body` refuses a body with a duplicate one.)
    pub(crate) fn members<'b>(&'b self) -> impl Iterator<Item = (&'b str, Field<'b>)> + 'b
    where
        'a: 'b,
    {
        let path = &self.path;
        self.entries
            .iter()
            .map(move |(k, v)| (k.as_str(), Field::new(path.key(k), Some(v))))
    }

    /// True when member `key` is present and not null.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .is_some_and(|(_, v)| !matches!(v, Raw::Null))
    }
}
