//! Chat messages and content parts (docs/api/common.md#content-parts, docs/api/openai.md#messages,
//! docs/api/databricks.md#chat-request): roles, content rules, tool calls in history, and the text
//! that counts toward the prompt's character limit.

use crate::error::CoreResult;

use super::codes;
use super::raw::{fail, Field, Obj, Raw};
use super::Flavor;

/// Media part types by the member that carries their location.
const MEDIA_TYPES: [&str; 3] = ["image_url", "video_url", "audio_url"];

/// Most media parts per chat request (docs/api/common.md#content-parts).
const MAX_CHAT_MEDIA: u32 = 20;

/// What content parts a route accepts.
#[derive(Copy, Clone, Debug)]
pub(crate) struct PartRules {
    /// Media types the route knows (`image_url` on generate, all three on chat).
    pub(crate) media: &'static [&'static str],
    /// Whether the model takes media at all (`Limits::multimodal`).
    pub(crate) multimodal: bool,
    /// Most media parts per request.
    pub(crate) max_media: u32,
    /// What `max_media` is called in the message ("image", "image, video and audio").
    pub(crate) media_name: &'static str,
}

/// The generate route's parts: text and at most one image.
pub(crate) const GENERATE_PARTS: &[&str] = &["image_url"];

impl PartRules {
    /// Chat parts: images, videos and audio (at most 20), on every chat flavour. Databricks
    /// chat takes them as OpenAI chat does (its vision endpoints take content parts), on a
    /// model that takes media.
    pub(crate) fn chat(_flavor: Flavor, multimodal: bool) -> PartRules {
        PartRules {
            media: &MEDIA_TYPES,
            multimodal,
            max_media: MAX_CHAT_MEDIA,
            media_name: "image, video and audio",
        }
    }
}

/// Counts media parts across a request so that the per-request limit covers every message.
#[derive(Default)]
pub(crate) struct MediaCount(pub(crate) u32);

/// A string or an array of content parts; returns the number of text characters (code points,
/// text parts joined). Media parts are checked for shape and counted; on a text-only model
/// they are rejected with `unsupported_content_type` naming the part's `type`
/// (docs/api/common.md#content-parts).
pub(crate) fn content(
    f: Field<'_>,
    rules: &PartRules,
    media: &mut MediaCount,
) -> CoreResult<Option<usize>> {
    match f.raw {
        None => Ok(None),
        Some(Raw::Str(s)) => Ok(Some(s.chars().count())),
        Some(Raw::List(parts)) => {
            if parts.is_empty() {
                return Err(f.bad(codes::EMPTY, "must not be an empty list of parts"));
            }
            let mut chars = 0;
            for (j, part) in parts.iter().enumerate() {
                let path = f.path.index(j);
                chars += content_part(Field::new(path, Some(part)), rules, media)?;
            }
            Ok(Some(chars))
        }
        Some(_) => Err(f.wrong_type("a string or a list of content parts")),
    }
}

fn content_part(f: Field<'_>, rules: &PartRules, media: &mut MediaCount) -> CoreResult<usize> {
    let Some(part) = f.obj()? else {
        return Err(f.wrong_type("a content part object"));
    };
    let ty_field = part.field("type");
    let ty = ty_field.str()?.ok_or_else(|| ty_field.missing())?;
    if ty == "text" {
        let text = part.field("text");
        let s = text.str()?.ok_or_else(|| text.missing())?;
        if s.is_empty() {
            return Err(text.bad(codes::EMPTY, "must not be empty"));
        }
        return Ok(s.chars().count());
    }
    if !MEDIA_TYPES.contains(&ty) {
        return Err(ty_field.bad(
            codes::INVALID_VALUE,
            "must be one of \"text\", \"image_url\", \"video_url\", \"audio_url\"",
        ));
    }
    if !rules.media.contains(&ty) || !rules.multimodal {
        let why = if rules.media.contains(&ty) {
            "the model is text-only".to_string()
        } else {
            format!("this route takes only text{} parts", media_list(rules))
        };
        return Err(fail(
            ty_field.path,
            codes::UNSUPPORTED_CONTENT_TYPE,
            format_args!("is {ty:?}, which is not supported: {why}"),
        ));
    }
    media_location(part.field(ty))?;
    media.0 += 1;
    if media.0 > rules.max_media {
        return Err(fail(
            f.path,
            codes::TOO_MANY,
            format_args!(
                "is over the limit of {} {} parts per request",
                rules.max_media, rules.media_name
            ),
        ));
    }
    Ok(0)
}

fn media_list(rules: &PartRules) -> String {
    if rules.media.is_empty() {
        String::new()
    } else {
        format!(" and {}", rules.media.join(", "))
    }
}

/// A media location: a non-empty string, or the OpenAI form `{"url": "..."}`
/// (docs/decisions.md#media-part-shapes).
fn media_location(f: Field<'_>) -> CoreResult<()> {
    let url = match f.raw {
        None => return Err(f.missing()),
        Some(Raw::Str(s)) => s.as_str(),
        Some(map @ Raw::Map(_)) => {
            let path = f.path.key("url");
            let url = Field::new(path, map.get("url"));
            url.str()?.ok_or_else(|| url.missing())?
        }
        Some(_) => return Err(f.wrong_type("a string or an object with `url`")),
    };
    if url.is_empty() {
        return Err(f.bad(codes::EMPTY, "must not be empty"));
    }
    Ok(())
}

/// `messages` of a chat route: a non-empty list of messages checked per flavour. Returns the
/// total text characters of every `content`.
pub(crate) fn messages(f: Field<'_>, flavor: Flavor, multimodal: bool) -> CoreResult<usize> {
    let items = f.list()?.ok_or_else(|| f.missing())?;
    if items.is_empty() {
        return Err(f.bad(codes::EMPTY, "must have at least one message"));
    }
    let rules = PartRules::chat(flavor, multimodal);
    let mut media = MediaCount::default();
    let mut chars = 0;
    for (i, item) in items.iter().enumerate() {
        let path = f.path.index(i);
        let item = Field::new(path, Some(item));
        let msg = item
            .obj()?
            .ok_or_else(|| item.wrong_type("a message object"))?;
        chars += message(&msg, i, flavor, &rules, &mut media)?;
    }
    Ok(chars)
}

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fn message(
    msg: &Obj<'_>,
    index: usize,
    flavor: Flavor,
    rules: &PartRules,
    media: &mut MediaCount,
) -> CoreResult<usize> {
    let role_field = msg.field("role");
    let role = role_field.str()?.ok_or_else(|| role_field.missing())?;
    if !ROLES.contains(&role) {
        return Err(role_field.bad(
            codes::INVALID_VALUE,
            "must be one of \"system\", \"user\", \"assistant\", \"tool\"",
        ));
    }
    if flavor == Flavor::Databricks && role == "system" && index > 0 {
        return Err(role_field.bad(
            codes::CONFLICT,
            "must not be \"system\" after the first message (one system message, first)",
        ));
    }
    let has_tool_calls = tool_calls(msg.field("tool_calls"), role)?;
    tool_call_id(msg.field("tool_call_id"), role, flavor)?;
    let content = msg.field("content");
    let chars = self::content(content, rules, media)?;
    // A list of parts is never empty here (`content` rejects `[]` and empty text parts), so
    // a media-only message counts as content even though it has no text.
    let is_empty = matches!(content.raw, None | Some(Raw::Str(_))) && chars.unwrap_or(0) == 0;
    let may_be_empty = role == "assistant" && has_tool_calls;
    if is_empty && !may_be_empty {
        return Err(match chars {
            None => content.missing(),
            Some(_) => content.bad(codes::EMPTY, "must not be empty"),
        });
    }
    if !is_empty && has_tool_calls && flavor == Flavor::Databricks {
        return Err(content.bad(
            codes::CONFLICT,
            "must be absent, null or \"\" on a message with `tool_calls`",
        ));
    }
    Ok(chars.unwrap_or(0))
}

/// `tool_calls` in history: only on assistant messages; each `{id, type: "function",
/// function: {name, arguments}}` with `arguments` a JSON string or an object
/// (docs/decisions.md#tool-call-arguments). Returns whether the message has at least one.
fn tool_calls(f: Field<'_>, role: &str) -> CoreResult<bool> {
    let Some(calls) = f.list()? else {
        return Ok(false);
    };
    if role != "assistant" && !calls.is_empty() {
        return Err(f.bad(codes::CONFLICT, "is allowed only on assistant messages"));
    }
    for (i, call) in calls.iter().enumerate() {
        let path = f.path.index(i);
        let call = Field::new(path, Some(call));
        let call = call
            .obj()?
            .ok_or_else(|| call.wrong_type("a tool call object"))?;
        non_empty_str(call.field("id"))?;
        function_type(call.field("type"))?;
        let func = call.field("function");
        let func = func.obj()?.ok_or_else(|| func.missing())?;
        non_empty_str(func.field("name"))?;
        let args = func.field("arguments");
        match args.raw {
            None => return Err(args.missing()),
            Some(Raw::Str(_) | Raw::Map(_)) => {}
            Some(_) => return Err(args.wrong_type("a JSON string or an object")),
        }
    }
    Ok(!calls.is_empty())
}

/// `tool_call_id`: required (non-empty) on tool messages; on other roles Databricks requires
/// it empty and MindIE ignores it (docs/decisions.md#tool-call-ids-on-other-roles).
fn tool_call_id(f: Field<'_>, role: &str, flavor: Flavor) -> CoreResult<()> {
    if role == "tool" {
        return non_empty_str(f).map(|_| ());
    }
    if flavor == Flavor::Databricks && f.str()?.is_some_and(|s| !s.is_empty()) {
        return Err(f.bad(codes::CONFLICT, "must be empty unless the role is \"tool\""));
    }
    Ok(())
}

/// A required, non-empty string.
pub(crate) fn non_empty_str<'a>(f: Field<'a>) -> CoreResult<&'a str> {
    let s = f.str()?.ok_or_else(|| f.missing())?;
    if s.is_empty() {
        return Err(f.bad(codes::EMPTY, "must not be empty"));
    }
    Ok(s)
}

/// A required `type` that must be "function".
pub(crate) fn function_type(f: Field<'_>) -> CoreResult<()> {
    match f.str()? {
        None => Err(f.missing()),
        Some("function") => Ok(()),
        Some(_) => Err(f.bad(codes::INVALID_VALUE, "must be \"function\"")),
    }
}
