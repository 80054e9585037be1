//! One request, one shape: admission against the model's vocabulary, per-request failures in
//! `update_with_logits`, the stop token id column, defaults resolved at intake, and seeds.

use std::sync::Arc;

use super::*;
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::types::FinishReason;

const VOCAB: usize = 8;

fn vocab_cfg(vocab_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        vocab_size,
        ..cfg(32, 4, 64, 8)
    }
}

fn greedy(p: SamplingParams) -> Arc<SamplingParams> {
    Arc::new(SamplingParams {
        temperature: 0.0,
        max_tokens: Some(4),
        ..p
    })
}

fn param_of(r: Result<(), CoreError>) -> String {
    match r {
        Err(CoreError::Invalid { param, .. }) => param,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn admission_rejects_what_does_not_fit_the_vocabulary() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                embedding_bias: Some(vec![0.0; VOCAB + 1].into()),
                ..d()
            },
            "embedding_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(1, 1.0), (VOCAB as u32, 1.0)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                allowed_token_ids: Some(vec![2, 9]),
                ..d()
            },
            "allowed_token_ids",
        ),
        (
            SamplingParams {
                bad_words: vec![vec![1], vec![1, 8]],
                ..d()
            },
            "bad_words",
        ),
        (
            SamplingParams {
                stop_token_ids: vec![100],
                ..d()
            },
            "stop_token_ids",
        ),
        (
            SamplingParams {
                stop_token_sequences: vec![vec![3, 8]],
                ..d()
            },
            "stop_token_sequences",
        ),
    ];
    for (p, field) in cases {
        let p = Arc::new(p);
        let mut s = Scheduler::new(vocab_cfg(VOCAB)).unwrap();
        assert_eq!(
            param_of(s.add_request(req(1, vec![1], p.clone(), 5, 0.0))),
            field
        );
        assert!(!s.has_unfinished_requests(), "{field}: nothing queued");
        // With the vocabulary unknown the same request is accepted.
        let mut s = Scheduler::new(vocab_cfg(0)).unwrap();
        s.add_request(req(1, vec![1], p, 5, 0.0)).unwrap();
    }
    let mut s = Scheduler::new(vocab_cfg(VOCAB)).unwrap();
    let p = Arc::new(SamplingParams::default());
    assert_eq!(
        param_of(s.add_request(req(1, vec![1, 8], p.clone(), 5, 0.0))),
        "prompt_token_ids"
    );
    let fits = SamplingParams {
        embedding_bias: Some(vec![0.0; VOCAB].into()),
        logit_bias: vec![(7, 1.0)],
        ..SamplingParams::default()
    };
    s.add_request(req(1, vec![7], Arc::new(fits), 5, 0.0))
        .unwrap();
}

/// Three greedy requests; the second allows only token 3, whose logit is -inf.
fn three_with_a_dead_row(s: &mut Scheduler) -> StepOutput {
    let dead = greedy(SamplingParams {
        allowed_token_ids: Some(vec![3]),
        ..SamplingParams::default()
    });
    add(
        s,
        1,
        vec![1, 2, 3],
        greedy(SamplingParams::default()),
        5,
        0.0,
    );
    add(s, 2, vec![1, 2, 3, 4, 5], dead, 5, 0.0);
    add(s, 3, vec![4, 5], greedy(SamplingParams::default()), 5, 0.0);
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_samples(), 3);
    let mut logits = vec![0.0f32; 3 * VOCAB];
    for (i, row) in logits.chunks_mut(VOCAB).enumerate() {
        row[5 + i % 2] = 1.0;
    }
    logits[VOCAB + 3] = f32::NEG_INFINITY;
    s.update_with_logits(plan.step_id, &logits, VOCAB).unwrap()
}

#[test]
fn a_row_with_no_finite_logit_fails_its_request_alone() {
    let mut s = Scheduler::new(vocab_cfg(0)).unwrap();
    let free_before = s.pool().num_free();
    let out = three_with_a_dead_row(&mut s);
    assert_eq!(out.failed_req_ids, vec![2]);
    assert!(
        out.failed_messages()[0].contains("no finite value"),
        "{:?}",
        out.failed_messages()
    );
    // The error keeps its rule, not only its text.
    assert!(matches!(
        out.failed_errors[0],
        CoreError::Invalid {
            code: "no_finite_logit",
            ..
        }
    ));
    assert_eq!(
        (out.req_ids.clone(), out.token_ids.clone()),
        (vec![1, 3], vec![5, 5])
    );
    assert!(out.finished_req_ids.is_empty());
    s.check_invariants().unwrap();
    let live: Vec<u64> = s.sequences().iter().map(|v| v.req_id.0).collect();
    assert_eq!(live, vec![1, 3], "request 2 is gone");
    // Requests 1 and 3 hold one block each (3 and 2 prompt tokens + 1, blocks of 4); 2's went back.
    assert_eq!(s.pool().num_free(), free_before - 2);
    let (_, out) = step(&mut s, 0.0, 6);
    assert_eq!(out.req_ids, vec![1, 3], "the others carry on");
    assert!(out.failed_req_ids.is_empty());
}

#[test]
fn parameters_that_do_not_fit_the_row_fail_their_request_when_the_vocabulary_is_unknown() {
    let mut s = Scheduler::new(vocab_cfg(0)).unwrap();
    let wrong = greedy(SamplingParams {
        embedding_bias: Some(vec![0.0; VOCAB - 1].into()),
        ..SamplingParams::default()
    });
    add(&mut s, 1, vec![1], wrong, 5, 0.0);
    add(
        &mut s,
        2,
        vec![1],
        greedy(SamplingParams::default()),
        5,
        0.0,
    );
    let plan = s.schedule(0.0);
    let mut logits = [0.0f32; 2 * VOCAB];
    logits[5] = 1.0;
    logits[VOCAB + 5] = 1.0;
    let out = s.update_with_logits(plan.step_id, &logits, VOCAB).unwrap();
    assert_eq!(out.failed_req_ids, vec![1]);
    assert!(out.failed_messages()[0].contains("`embedding_bias`"));
    assert_eq!(out.req_ids, vec![2]);
    s.check_invariants().unwrap();
    // Whole-step errors still fail the call and change nothing.
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_samples(), 1);
    assert!(s
        .update_with_logits(plan.step_id, &[0.0; VOCAB + 1], VOCAB)
        .is_err());
    let out = s
        .update_with_logits(plan.step_id, &logits[..VOCAB], VOCAB)
        .unwrap();
    assert_eq!(out.token_ids, vec![5]);
}

#[test]
fn stop_token_id_column_names_the_stop_token_but_never_eos() {
    let mk = |ignore_eos, stop: Vec<u32>| {
        Arc::new(SamplingParams {
            ignore_eos,
            stop_token_ids: stop,
            max_tokens: Some(9),
            ..SamplingParams::default()
        })
    };
    // (params, sampled token, finish reason, stop token id); EOS is 0 in `cfg`.
    let cases = [
        (mk(false, vec![42]), 42, FinishReason::Stop as u8, 42),
        (mk(false, vec![42]), 0, FinishReason::Stop as u8, -1),
        (mk(false, vec![0, 42]), 0, FinishReason::Stop as u8, -1),
        (mk(true, vec![0]), 0, FinishReason::Stop as u8, 0),
        (mk(false, vec![42]), 5, 0, -1),
    ];
    for (i, (p, token, reason, id)) in cases.into_iter().enumerate() {
        let mut s = Scheduler::new(cfg(16, 4, 64, 4)).unwrap();
        add(&mut s, 1, vec![1, 2, 3], p, 5, 0.0);
        let (_, out) = step(&mut s, 0.0, token);
        assert_eq!(
            (out.finish_reasons, out.stop_token_ids),
            (vec![reason], vec![id]),
            "case {i}"
        );
    }
}

#[test]
fn intake_resolves_priority_deadline_and_salt_from_the_request() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    let p = Arc::new(SamplingParams {
        priority: 2,
        timeout_s: Some(5.0),
        ..SamplingParams::default()
    });
    s.add_request(NewRequest {
        arrival_time: 1.0,
        ..NewRequest::new(1, vec![1, 2, 3], p.clone())
    })
    .unwrap();
    assert_eq!(
        s.sequences()[0].priority,
        2,
        "priority defaults to params.priority"
    );
    assert_eq!(
        param_of(s.add_request(NewRequest {
            arrival_time: f64::INFINITY,
            ..NewRequest::new(2, vec![1], p)
        })),
        "arrival_time"
    );
    assert!(s.schedule(5.9).finished_req_ids.is_empty());
    s.update(s.pending_step_id().unwrap(), &[9]).unwrap();
    assert_eq!(
        s.schedule(6.0).finished_req_ids,
        vec![1],
        "deadline = arrival + timeout_s"
    );
    // Requests of one salt share cached blocks; the salt is not a plain extra key.
    let prompt: Vec<u32> = (1..=9).collect();
    let salted = |id, salt: &str| NewRequest {
        cache_salt: Some(salt.into()),
        ..req(id, prompt.clone(), params(1, 1), 5, 0.0)
    };
    s.add_request(salted(3, "a")).unwrap();
    step(&mut s, 7.0, 9);
    s.add_request(salted(4, "a")).unwrap();
    assert_eq!(step(&mut s, 7.0, 9).0.num_scheduled_tokens(), 1);
    s.add_request(salted(5, "b")).unwrap();
    assert_eq!(step(&mut s, 7.0, 9).0.num_scheduled_tokens(), 9);
}

/// The tokens a sampled run of three unseeded requests draws under the scheduler seed `seed`.
fn sampled_run(seed: Option<u64>) -> Vec<u32> {
    let mut s = Scheduler::new(SchedulerConfig {
        seed,
        ..cfg(32, 4, 64, 8)
    })
    .unwrap();
    for id in 0..3 {
        add(&mut s, id, vec![1, 2], params(1, 4), 5, 0.0);
    }
    let mut tokens = Vec::new();
    while s.has_unfinished_requests() {
        let plan = s.schedule(0.0);
        let logits = vec![0.0f32; plan.num_samples() * 1000];
        tokens.extend(
            s.update_with_logits(plan.step_id, &logits, 1000)
                .unwrap()
                .token_ids,
        );
    }
    tokens
}

#[test]
fn a_scheduler_seed_makes_unseeded_requests_reproducible() {
    assert_eq!(sampled_run(Some(7)), sampled_run(Some(7)));
    assert_ne!(sampled_run(Some(7)), sampled_run(Some(8)));
    assert_ne!(
        sampled_run(None),
        sampled_run(None),
        "OS-random without a seed"
    );
}

#[test]
fn virtual_prompt_ids_are_admitted_only_up_to_the_table() {
    let mut s = Scheduler::new(vocab_cfg(10)).unwrap();
    let virtual_req = |id, prompt: Vec<u32>, num_virtual| NewRequest {
        num_virtual_tokens: num_virtual,
        cache_salt: Some("table".into()),
        ..NewRequest::new(id, prompt, params(1, 1))
    };
    // Ids 10 and 11 are table rows 0 and 1 of a two-row table; 12 is past it.
    s.add_request(virtual_req(1, vec![10, 11, 3], 2)).unwrap();
    assert_eq!(
        param_of(s.add_request(virtual_req(2, vec![12], 2))),
        "prompt_token_ids"
    );
    assert_eq!(
        param_of(s.add_request(virtual_req(3, vec![10], 0))),
        "prompt_token_ids"
    );
    // The plan carries the virtual ids to the runner unchanged.
    let plan = s.schedule(0.0);
    assert_eq!(plan.input_ids[..2], [10, 11]);
}
