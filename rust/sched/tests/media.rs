//! Media spans in the scheduler: block hashes mix in the digests of the spans each block
//! overlaps (text before the first image is shared whatever the image), and each step starts
//! the encoder work of at most `max_num_encoder_tokens` span positions.

use super::*;
use crate::sched::MediaSpan;

/// Image placeholder token: every image's positions hold it, whatever the image.
const IMG: u32 = 100;

fn span(offset: usize, length: usize, digest: &str) -> MediaSpan {
    MediaSpan {
        offset,
        length,
        digest: digest.into(),
    }
}

/// `num_text` text tokens, then an image of `num_image` positions (digest `digest`), then
/// `num_tail` text tokens.
fn with_image(
    id: u64,
    num_text: usize,
    num_image: usize,
    num_tail: usize,
    digest: &str,
    t: f64,
) -> NewRequest {
    let mut prompt: Vec<u32> = (1..=num_text as u32).collect();
    prompt.extend(std::iter::repeat_n(IMG, num_image));
    prompt.extend(200..200 + num_tail as u32);
    NewRequest {
        media: vec![span(num_text, num_image, digest)],
        ..req(id, prompt, params(1, 4), 5, t)
    }
}

/// Prompt tokens each request of `plan` computes, by request id.
fn rows_of(plan: &StepPlan) -> Vec<(u64, i32)> {
    let lens = plan.cu_seqlens_q.windows(2).map(|w| w[1] - w[0]);
    plan.req_ids.iter().copied().zip(lens).collect()
}

fn encoder_cfg(budget: usize, max_num_encoder_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_encoder_tokens,
        ..cfg(64, 4, budget, 8)
    }
}

#[test]
fn text_before_an_image_is_shared_across_images_and_the_image_only_with_itself() {
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    // Blocks 0-1 text, 2-3 the image, then 2 tokens of text (18 tokens: 4 full blocks).
    s.add_request(with_image(1, 8, 8, 2, "a", 0.0)).unwrap();
    let (plan, _) = step(&mut s, 0.0, 5);
    assert_eq!(rows_of(&plan), vec![(1, 18)]);
    // Another image: the two text blocks hit, the image's first block on misses.
    s.add_request(with_image(2, 8, 8, 2, "b", 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert!(rows_of(&plan).contains(&(2, 10)), "{:?}", rows_of(&plan));
    // The same image: every full block hits.
    s.add_request(with_image(3, 8, 8, 2, "a", 2.0)).unwrap();
    let (plan, _) = step(&mut s, 2.0, 5);
    assert!(rows_of(&plan).contains(&(3, 2)), "{:?}", rows_of(&plan));
    // The same image a position later: its blocks hold other embeddings, so only block 0 hits.
    let mut prompt: Vec<u32> = (1..=7).collect();
    prompt.extend(std::iter::repeat_n(IMG, 8));
    prompt.extend([200, 201, 202]);
    s.add_request(NewRequest {
        media: vec![span(7, 8, "a")],
        ..req(4, prompt, params(1, 4), 5, 3.0)
    })
    .unwrap();
    let (plan, _) = step(&mut s, 3.0, 5);
    assert!(rows_of(&plan).contains(&(4, 14)), "{:?}", rows_of(&plan));
}

#[test]
fn an_image_starting_mid_block_misses_from_that_block_on() {
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    // Text 0..6, image 6..14: block 1 (4..8) already holds image positions.
    s.add_request(with_image(1, 6, 8, 6, "a", 0.0)).unwrap();
    step(&mut s, 0.0, 5);
    s.add_request(with_image(2, 6, 8, 6, "b", 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert!(rows_of(&plan).contains(&(2, 16)), "{:?}", rows_of(&plan));
    // A text-only prompt with the same tokens shares only block 0 too.
    let mut prompt: Vec<u32> = (1..=6).collect();
    prompt.extend(std::iter::repeat_n(IMG, 8));
    prompt.extend(200..206);
    add(&mut s, 3, prompt, params(1, 4), 5, 2.0);
    let (plan, _) = step(&mut s, 2.0, 5);
    assert!(rows_of(&plan).contains(&(3, 16)), "{:?}", rows_of(&plan));
}

#[test]
fn spans_are_checked_at_intake() {
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    let bad = |id, media: Vec<MediaSpan>| NewRequest {
        media,
        ..req(id, (1..=10).collect(), params(1, 4), 5, 0.0)
    };
    let code_of = |r: Result<(), CoreError>| match r {
        Err(CoreError::Invalid { param, code, .. }) => (param, code),
        other => panic!("expected Invalid, got {other:?}"),
    };
    let cases = [
        (vec![span(2, 0, "a")], "empty"),
        (vec![span(0, 4, "a"), span(3, 2, "b")], "overlapping"),
        (vec![span(4, 2, "a"), span(0, 2, "b")], "overlapping"),
        (vec![span(8, 3, "a")], "out_of_range"),
    ];
    for (i, (media, code)) in cases.into_iter().enumerate() {
        let got = code_of(s.add_request(bad(i as u64, media)));
        assert_eq!(got, ("media".to_string(), code));
    }
    assert!(!s.has_unfinished_requests(), "nothing queued");
    s.add_request(bad(9, vec![span(0, 4, "a"), span(4, 6, "b")]))
        .unwrap();
}

#[test]
fn images_over_the_encoder_budget_spread_over_steps_and_text_is_unaffected() {
    let mut s = Scheduler::new(encoder_cfg(64, 10)).unwrap();
    s.add_request(with_image(1, 2, 8, 2, "a", 0.0)).unwrap();
    add(&mut s, 2, (1..=12).collect(), params(1, 4), 5, 0.5);
    s.add_request(with_image(3, 2, 8, 2, "b", 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    // Request 3's chunk is cut exactly before its image: 8 + 8 > 10.
    assert_eq!(rows_of(&plan), vec![(1, 12), (2, 12), (3, 2)]);
    assert_eq!(plan.num_encoder_tokens, 8);
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(rows_of(&plan), vec![(1, 1), (2, 1), (3, 10)]);
    assert_eq!(plan.num_encoder_tokens, 8);
}

#[test]
fn a_request_whose_image_starts_its_chunk_waits_for_the_next_step() {
    let mut s = Scheduler::new(encoder_cfg(64, 10)).unwrap();
    s.add_request(with_image(1, 0, 8, 2, "a", 0.0)).unwrap();
    s.add_request(with_image(2, 0, 8, 2, "b", 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(
        rows_of(&plan),
        vec![(1, 10)],
        "request 2 would start at its image"
    );
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(rows_of(&plan), vec![(1, 1), (2, 10)]);
}

#[test]
fn a_span_longer_than_the_budget_runs_as_the_steps_first() {
    let mut s = Scheduler::new(encoder_cfg(64, 4)).unwrap();
    s.add_request(with_image(1, 1, 8, 1, "a", 0.0)).unwrap();
    s.add_request(with_image(2, 3, 8, 1, "b", 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(rows_of(&plan), vec![(1, 10), (2, 3)]);
    assert_eq!(plan.num_encoder_tokens, 8);
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(rows_of(&plan), vec![(1, 1), (2, 9)]);
    assert_eq!(plan.num_encoder_tokens, 8);
}

#[test]
fn a_span_counts_once_in_the_step_its_first_chunk_reaches_it() {
    // Chunks of 6 over text 0..2, image 2..10, text 10..14.
    let mut s = Scheduler::new(encoder_cfg(6, 8)).unwrap();
    s.add_request(with_image(1, 2, 8, 4, "a", 0.0)).unwrap();
    let counts: Vec<(Vec<(u64, i32)>, usize)> = (0..3)
        .map(|_| {
            let (plan, _) = step(&mut s, 0.0, 5);
            (rows_of(&plan), plan.num_encoder_tokens)
        })
        .collect();
    assert_eq!(
        counts,
        vec![(vec![(1, 6)], 8), (vec![(1, 6)], 0), (vec![(1, 2)], 0)]
    );
}

#[test]
fn a_recompute_after_preemption_counts_the_span_again() {
    // Five usable blocks of 4: request 2 (priority 1, 16 tokens) preempts request 1.
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: false,
        max_num_encoder_tokens: 8,
        ..cfg(6, 4, 64, 8)
    })
    .unwrap();
    s.add_request(with_image(1, 2, 8, 2, "a", 0.0)).unwrap();
    let (plan, _) = step(&mut s, 0.0, 5);
    assert_eq!(
        (rows_of(&plan), plan.num_encoder_tokens),
        (vec![(1, 12)], 8)
    );
    add(&mut s, 2, (1..=16).collect(), params(1, 1), 1, 1.0);
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(plan.preempted_req_ids, vec![1]);
    assert_eq!(
        (rows_of(&plan), plan.num_encoder_tokens),
        (vec![(2, 16)], 0)
    );
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(
        rows_of(&plan),
        vec![(1, 13)],
        "prompt and its output recomputed"
    );
    assert_eq!(plan.num_encoder_tokens, 8);
}
