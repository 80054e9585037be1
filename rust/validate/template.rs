//! What a chat template and a text-only prompt see of a validated body: content parts joined
//! into text (docs/decisions.md#content-parts-on-a-text-only-model), and tool-call arguments as
//! objects (what Hugging Face templates expect), whichever form the client sent. One rule for every
//! route that joins text (MindIE's `text_input` parts too).

use super::json::parse_value;
use super::raw::Raw;

/// A text-only model's content: a string as it is, or its `text` parts joined in order (other
/// parts were refused or counted by validation); absent or null is "".
pub fn joined_text(content: Option<&Raw>) -> String {
    match content {
        Some(Raw::Str(s)) => s.clone(),
        Some(Raw::List(parts)) => parts
            .iter()
            .filter(|part| matches!(part.get("type"), Some(Raw::Str(t)) if t == "text"))
            .filter_map(|part| match part.get("text") {
                Some(Raw::Str(text)) => Some(text.as_str()),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The messages as the template renders them: `role`, joined `content`, `name` and
/// `tool_call_id` when given, and `tool_calls` with each call's arguments as an object.
pub fn template_messages(messages: &[Raw]) -> Vec<Raw> {
    messages.iter().map(template_message).collect()
}

fn template_message(m: &Raw) -> Raw {
    let mut out = vec![
        (
            "role".to_owned(),
            m.get("role").cloned().unwrap_or(Raw::Null),
        ),
        (
            "content".to_owned(),
            Raw::Str(joined_text(m.get("content"))),
        ),
    ];
    for key in ["name", "tool_call_id"] {
        if let Some(value) = m.get(key).filter(|v| !matches!(v, Raw::Null)) {
            out.push((key.to_owned(), value.clone()));
        }
    }
    if let Some(Raw::List(calls)) = m.get("tool_calls") {
        if !calls.is_empty() {
            let calls = calls.iter().map(template_tool_call).collect();
            out.push(("tool_calls".to_owned(), Raw::List(calls)));
        }
    }
    Raw::Map(out)
}

fn template_tool_call(call: &Raw) -> Raw {
    let member =
        |raw: Option<&Raw>, key: &str| raw.and_then(|r| r.get(key)).cloned().unwrap_or(Raw::Null);
    let function = call.get("function");
    let kind = match call.get("type") {
        Some(Raw::Null) | None => Raw::Str("function".to_owned()),
        Some(kind) => kind.clone(),
    };
    let arguments = match function.and_then(|f| f.get("arguments")) {
        // A JSON string becomes the object it encodes; a string that is not JSON stays.
        Some(Raw::Str(text)) => parse_value(text).unwrap_or_else(|| Raw::Str(text.clone())),
        Some(other) => other.clone(),
        None => Raw::Null,
    };
    Raw::Map(vec![
        ("id".to_owned(), member(Some(call), "id")),
        ("type".to_owned(), kind),
        (
            "function".to_owned(),
            Raw::Map(vec![
                ("name".to_owned(), member(function, "name")),
                ("arguments".to_owned(), arguments),
            ]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::parse_body;

    fn body(json: &str) -> Raw {
        parse_body(json.as_bytes()).unwrap()
    }

    #[test]
    fn text_parts_join_in_order_and_other_parts_drop() {
        let b = body(
            r#"{"c": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]}"#,
        );
        assert_eq!(joined_text(b.get("c")), "ab");
        assert_eq!(joined_text(Some(&Raw::Str("plain".into()))), "plain");
        assert_eq!(joined_text(None), "");
        assert_eq!(joined_text(Some(&Raw::Null)), "");
    }

    #[test]
    fn tool_call_arguments_become_objects_and_names_pass_through() {
        let b = body(
            r#"{"m": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}}, {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}, {"role": "tool", "content": "3", "tool_call_id": "c1", "name": null}]}"#,
        );
        let Some(Raw::List(messages)) = b.get("m") else {
            panic!()
        };
        let out = template_messages(messages);
        let call = &out[0].get("tool_calls").unwrap();
        let Raw::List(calls) = call else { panic!() };
        let args = calls[0].get("function").unwrap().get("arguments").unwrap();
        let Raw::Map(members) = args else {
            panic!("{args:?}")
        };
        let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a"]); // the client's order
        assert_eq!(calls[0].get("type"), Some(&Raw::Str("function".into())));
        let kept = calls[1].get("function").unwrap().get("arguments");
        assert_eq!(kept, Some(&Raw::Str("not json".into())));
        assert_eq!(out[0].get("content"), Some(&Raw::Str(String::new())));
        assert_eq!(out[1].get("tool_call_id"), Some(&Raw::Str("c1".into())));
        assert_eq!(out[1].get("name"), None); // null is left out
    }
}
