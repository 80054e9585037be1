//! `Limits`, the prompt-token limit, `Route::parse` and `EndpointType::parse`.

use crate::error::CoreError;
use crate::validate::codes::*;
use crate::validate::{
    check_prompt_tokens, max_prompt_tokens, EndpointType, Limits, Route, MAX_PROMPT_TOKENS_CAP,
};

fn param_of<T: std::fmt::Debug>(result: Result<T, CoreError>) -> String {
    match result {
        Err(CoreError::Invalid { param, message, .. }) => {
            assert!(message.starts_with(&format!("`{param}`")), "{message}");
            param
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Makes one limit invalid.
type Breaker = fn(&mut Limits);

#[test]
fn limits_validate_names_the_field() {
    assert!(Limits::default().validate().is_ok());
    #[rustfmt::skip]
    let cases: [(Breaker, &str); 9] = [
        (|l| l.max_model_len = 1, "max_model_len"),
        (|l| l.max_input_tokens = 0, "max_input_tokens"),
        (|l| l.max_position_embeddings = Some(0), "max_position_embeddings"),
        (|l| l.max_iter_times = 0, "max_iter_times"),
        (|l| l.max_prompt_chars = 0, "max_prompt_chars"),
        (|l| l.max_stop_chars = 0, "max_stop_chars"),
        (|l| l.max_n = 129, "max_n"),
        (|l| l.max_logprobs = 21, "max_logprobs"),
        (|l| l.max_beam_width = 0, "max_beam_width"),
    ];
    for (break_it, field) in cases {
        let mut limits = Limits::default();
        break_it(&mut limits);
        assert_eq!(param_of(limits.validate()), field);
    }
}

#[test]
fn prompt_token_limit_is_the_least_term() {
    let base = Limits {
        max_model_len: 4096,
        max_input_tokens: 8192,
        ..Limits::default()
    };
    assert_eq!(max_prompt_tokens(&base), 4095, "maxSeqLen - 1");
    let l = Limits {
        max_input_tokens: 100,
        ..base.clone()
    };
    assert_eq!(max_prompt_tokens(&l), 100, "maxInputTokenLen");
    let l = Limits {
        max_position_embeddings: Some(50),
        ..base.clone()
    };
    assert_eq!(max_prompt_tokens(&l), 50, "max_position_embeddings");
    let l = Limits {
        max_model_len: u32::MAX,
        max_input_tokens: u32::MAX,
        ..base.clone()
    };
    assert_eq!(
        max_prompt_tokens(&l),
        MAX_PROMPT_TOKENS_CAP,
        "the 1M token cap"
    );
    assert!(check_prompt_tokens(1, &base).is_ok() && check_prompt_tokens(4095, &base).is_ok());
    assert_eq!(param_of(check_prompt_tokens(4096, &base)), "prompt");
    match check_prompt_tokens(0, &base) {
        Err(CoreError::Invalid { code, .. }) => assert_eq!(code, EMPTY),
        other => panic!("{other:?}"),
    }
}

#[test]
fn route_and_endpoint_names() {
    assert_eq!(Route::parse("generate").unwrap(), Route::Generate);
    assert_eq!(Route::parse("generate_stream").unwrap(), Route::Generate);
    assert_eq!(
        Route::parse("databricks_embeddings").unwrap(),
        Route::DatabricksEmbeddings
    );
    assert_eq!(Route::parse("offline").unwrap(), Route::Offline);
    assert_eq!(param_of(Route::parse("v1/chat")), "route");
    for t in [
        EndpointType::PayPerToken,
        EndpointType::ProvisionedThroughput,
    ] {
        assert_eq!(EndpointType::parse(t.as_str()).unwrap(), t);
    }
    assert_eq!(
        param_of(EndpointType::parse("free")),
        "databricks_endpoint_type"
    );
}
