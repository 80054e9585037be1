//! `tools`, `tool_choice` and `response_format` of the chat routes (docs/api/openai.md#tools,
//! docs/api/databricks.md#chat-request, docs/decisions.md#tools-and-messages).

use rustc_hash::FxHashSet;

use crate::error::CoreResult;

use super::codes;
use super::messages::{function_type, non_empty_str};
use super::raw::{fail, Field, Obj, Raw};
use super::Flavor;

/// Most `properties` a Databricks function's `parameters` may declare.
const MAX_DATABRICKS_PROPERTIES: usize = 15;

/// `tools`: a list of `{type: "function", function: {name, description?, strict?,
/// parameters?}}` with unique names; at most `max_tools` of them when given. Returns the
/// function names, in order.
pub(crate) fn tools<'a>(
    f: Field<'a>,
    flavor: Flavor,
    max_tools: Option<u32>,
) -> CoreResult<Vec<&'a str>> {
    let Some(items) = f.list()? else {
        return Ok(Vec::new());
    };
    if let Some(max) = max_tools {
        if items.len() > max as usize {
            return Err(f.bad(
                codes::TOO_MANY,
                format_args!("must have at most {max} tools (it has {})", items.len()),
            ));
        }
    }
    let mut names: Vec<&'a str> = Vec::with_capacity(items.len());
    let mut seen = FxHashSet::default(); // `names.contains` would be quadratic in 50,000 tools
    for (i, item) in items.iter().enumerate() {
        let path = f.path.index(i);
        let item = Field::new(path, Some(item));
        let tool = item
            .obj()?
            .ok_or_else(|| item.wrong_type("a tool object"))?;
        function_type(tool.field("type"))?;
        let func = tool.field("function");
        let func = func.obj()?.ok_or_else(|| func.missing())?;
        let name_field = func.field("name");
        non_empty_str(name_field)?;
        let name = lookup_name(&items[i]); // the same string, borrowed from the body
        if !seen.insert(name) {
            return Err(name_field.bad(codes::CONFLICT, "must be unique within `tools`"));
        }
        func.field("description").str()?;
        func.field("strict").bool()?;
        if let Some(params) = func.field("parameters").obj()? {
            match flavor {
                Flavor::MindIE => mindie_parameters(&params)?,
                Flavor::Databricks => databricks_parameters(&params)?,
            }
        }
        names.push(name);
    }
    Ok(names)
}

/// The function name of a tool already checked by [`tools`], borrowed from the body.
fn lookup_name(tool: &Raw) -> &str {
    match tool.get("function").and_then(|f| f.get("name")) {
        Some(Raw::Str(s)) => s,
        _ => "",
    }
}

/// MindIE rules (docs/decisions.md#function-parameters): `type` "object", `properties` an object of
/// objects, `required` a list of strings, `additionalProperties` a bool when present.
fn mindie_parameters(params: &Obj<'_>) -> CoreResult<()> {
    let ty = params.field("type");
    match ty.str()? {
        None => return Err(ty.missing()),
        Some("object") => {}
        Some(_) => return Err(ty.bad(codes::INVALID_VALUE, "must be \"object\"")),
    }
    let props = params.field("properties");
    let props = props.obj()?.ok_or_else(|| props.missing())?;
    for (_, prop) in props.members() {
        prop.obj()?;
    }
    let required = params.field("required");
    let names = required.list()?.ok_or_else(|| required.missing())?;
    for (i, name) in names.iter().enumerate() {
        let path = required.path.index(i);
        let name = Field::new(path, Some(name));
        if !matches!(name.raw, Some(Raw::Str(_))) {
            return Err(name.wrong_type("a string"));
        }
    }
    params.field("additionalProperties").bool()?;
    Ok(())
}

/// Databricks rules (docs/decisions.md#function-parameters): a JSON Schema object whose
/// `properties`, when present, is an object of at most 15 keys.
fn databricks_parameters(params: &Obj<'_>) -> CoreResult<()> {
    let field = params.field("properties");
    if let Some(props) = field.obj()? {
        let count = props.entries.len();
        if count > MAX_DATABRICKS_PROPERTIES {
            return Err(fail(
                field.path,
                codes::TOO_MANY,
                format_args!("must have at most {MAX_DATABRICKS_PROPERTIES} keys (it has {count})"),
            ));
        }
    }
    Ok(())
}

/// `tool_choice`: "none", "auto", "required" or `{type: "function", function: {name}}`
/// naming a function of `tools`; "required" and a named choice need tools
/// (docs/decisions.md#the-default-tool-choice).
pub(crate) fn tool_choice(f: Field<'_>, names: &[&str]) -> CoreResult<()> {
    let needs_tools = match f.raw {
        None => false,
        Some(Raw::Str(s)) => match s.as_str() {
            "none" | "auto" => false,
            "required" => true,
            _ => {
                return Err(f.bad(
                    codes::INVALID_VALUE,
                    "must be \"none\", \"auto\", \"required\" or a function object",
                ))
            }
        },
        Some(Raw::Map(_)) => {
            named_choice(f, names)?;
            true
        }
        Some(_) => return Err(f.wrong_type("a string or an object")),
    };
    if needs_tools && names.is_empty() {
        return Err(f.bad(codes::CONFLICT, "needs a non-empty `tools`"));
    }
    Ok(())
}

fn named_choice(f: Field<'_>, names: &[&str]) -> CoreResult<()> {
    let obj = f.obj()?.expect("a map is an object");
    function_type(obj.field("type"))?;
    let func = obj.field("function");
    let func = func.obj()?.ok_or_else(|| func.missing())?;
    let name_field = func.field("name");
    let name = non_empty_str(name_field)?;
    if !names.is_empty() && !names.contains(&name) {
        return Err(name_field.bad(
            codes::INVALID_VALUE,
            format_args!("must name a function in `tools` ({})", names.join(", ")),
        ));
    }
    Ok(())
}

/// `response_format`: `{type: "text" | "json_object" | "json_schema"}`, the last with
/// `json_schema: {name, schema, description?, strict?}`. Whether the deployment can enforce
/// the JSON forms (docs/decisions.md#enforcing-response-formats) is the server's call.
pub(crate) fn response_format(f: Field<'_>) -> CoreResult<()> {
    let Some(obj) = f.obj()? else {
        return Ok(());
    };
    let ty = obj.field("type");
    match ty.str()? {
        None => Err(ty.missing()),
        Some("text" | "json_object") => Ok(()),
        Some("json_schema") => {
            let schema = obj.field("json_schema");
            let schema = schema.obj()?.ok_or_else(|| schema.missing())?;
            non_empty_str(schema.field("name"))?;
            let body = schema.field("schema");
            body.obj()?.ok_or_else(|| body.missing())?;
            schema.field("description").str()?;
            schema.field("strict").bool()?;
            Ok(())
        }
        Some(_) => Err(ty.bad(
            codes::INVALID_VALUE,
            "must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}
