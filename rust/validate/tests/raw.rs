//! `Raw`, field paths and the typed getters (docs/api/common.md#request-bodies).

use super::parse;
use crate::validate::codes::*;
use crate::validate::raw::{Field, Obj, Path};
use crate::validate::Raw;

#[test]
fn paths_render_as_the_client_wrote_them() {
    let root = Path::Root;
    let messages = root.key("messages");
    let msg = messages.index(2);
    let content = msg.key("content");
    let part = content.index(1);
    assert_eq!(part.key("type").to_string(), "messages[2].content[1].type");
    assert_eq!(root.to_string(), "body");
    assert_eq!(root.key("stop").index(3).to_string(), "stop[3]");
}

#[test]
fn display_quotes_and_cuts_values() {
    assert_eq!(
        parse(r#"{"a": [1, 2.5, "x", null, true]}"#).to_string(),
        r#"{"a": [1, 2.5, "x", null, true]}"#
    );
    let long = Raw::Str("é".repeat(200));
    let shown = long.to_string();
    assert!(shown.ends_with("...") && shown.len() <= 84, "{shown}");
    let mut deep = Raw::Int(1);
    for _ in 0..100_000 {
        deep = Raw::List(vec![deep]);
    }
    assert!(
        deep.to_string().starts_with("[[[["),
        "a deep value is cut, not recursed"
    );
    // Dropping 100k nested lists recurses; what this test checks is rendering.
    std::mem::forget(deep);
}

#[test]
fn getters_apply_the_type_rules() {
    let body = parse(
        r#"{"i": 5, "f": 5.0, "h": 5.5, "big": 1e300, "s": "5", "b": true, "n": null, "inf": 1e39}"#,
    );
    let o = Obj::root(&body).unwrap();
    assert_eq!(o.field("i").int().unwrap(), Some(5));
    assert_eq!(
        o.field("f").int().unwrap(),
        Some(5),
        "an integral float is an integer"
    );
    assert_eq!(o.field("n").int().unwrap(), None, "null is absent");
    assert_eq!(o.field("absent").int().unwrap(), None);
    for key in ["h", "big", "s", "b"] {
        let err = o.field(key).int().unwrap_err();
        assert!(
            matches!(
                err,
                crate::error::CoreError::Invalid {
                    code: WRONG_TYPE,
                    ..
                }
            ),
            "{key}"
        );
    }
    assert_eq!(
        o.field("i").float().unwrap(),
        Some(5.0),
        "an integer is a float"
    );
    assert!(o.field("s").float().is_err() && o.field("b").float().is_err());
    let err = o.field("inf").float().unwrap_err();
    assert!(matches!(
        err,
        crate::error::CoreError::Invalid {
            code: OUT_OF_RANGE,
            ..
        }
    ));
    assert_eq!(o.field("b").bool().unwrap(), Some(true));
    assert!(o.field("i").bool().is_err() && o.field("s").bool().is_err());
    assert_eq!(o.field("s").str().unwrap(), Some("5"));
    assert!(o.field("i").str().is_err());
    assert!(o.has("i") && !o.has("n") && !o.has("absent"));
    assert!(Field::new(Path::Root, Some(&Raw::Null)).raw.is_none());
    assert_eq!(body.get("i"), Some(&Raw::Int(5)));
    assert_eq!(Raw::Int(1).get("i"), None);
    // A repeated key: the last one wins, as with JSON decoders.
    let dup = parse(r#"{"k": 1, "k": 2}"#);
    assert_eq!(Obj::root(&dup).unwrap().field("k").int().unwrap(), Some(2));
}
