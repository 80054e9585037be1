//! LoRA adapters in the scheduler: each row carries its request's adapter, the prefix cache
//! never shares blocks across adapters, and at most `max_loras` distinct adapters run at once.

use super::*;

fn on(id: u64, prompt: Vec<u32>, lora_id: u32, t: f64) -> NewRequest {
    NewRequest {
        lora_id,
        ..req(id, prompt, params(1, 4), 5, t)
    }
}

#[test]
fn rows_carry_their_adapter() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 4)).unwrap();
    s.add_request(on(1, vec![1, 2, 3], 7, 0.0)).unwrap();
    s.add_request(on(2, vec![4, 5], 0, 0.0)).unwrap();
    let (plan, _) = step(&mut s, 0.0, 3);
    assert_eq!(plan.req_ids, vec![1, 2]);
    assert_eq!(plan.lora_ids, vec![7, 0]);
    let (plan, _) = step(&mut s, 0.0, 3);
    assert_eq!(plan.lora_ids, vec![7, 0], "decode rows too");
}

#[test]
fn the_prefix_cache_is_per_adapter() {
    let prompt: Vec<u32> = (1..=10).collect();
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    s.add_request(on(1, prompt.clone(), 3, 0.0)).unwrap();
    step(&mut s, 0.0, 5);
    // The base model and another adapter share nothing with adapter 3's blocks.
    s.add_request(on(2, prompt.clone(), 0, 1.0)).unwrap();
    s.add_request(on(3, prompt.clone(), 4, 1.0)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(plan.num_prefill_tokens, 20);
    // The same adapter (and the same salt) hits its two full blocks.
    s.add_request(on(4, prompt.clone(), 3, 2.0)).unwrap();
    let salted = NewRequest {
        cache_salt: Some("t".into()),
        ..on(5, prompt.clone(), 3, 2.0)
    };
    s.add_request(salted).unwrap();
    let (plan, _) = step(&mut s, 2.0, 5);
    let rows: Vec<u64> = plan.req_ids.clone();
    let prefill: Vec<i32> = plan.cu_seqlens_q.windows(2).map(|w| w[1] - w[0]).collect();
    let by_req: Vec<(u64, i32)> = rows.into_iter().zip(prefill).collect();
    assert!(
        by_req.contains(&(4, 2)),
        "adapter 3 again: blocks reused {by_req:?}"
    );
    assert!(
        by_req.contains(&(5, 10)),
        "adapter 3 with a salt: nothing {by_req:?}"
    );
}

#[test]
fn at_most_max_loras_adapters_run_at_once() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_loras: 2,
        ..cfg(64, 4, 64, 8)
    })
    .unwrap();
    // Adapters 1 and 2 run; 3 waits (and, no overtaking, so does the base request behind it)
    // while 1 and 2 have sequences running; a second request on adapter 1 may join.
    s.add_request(on(1, vec![1, 2], 1, 0.0)).unwrap();
    s.add_request(on(2, vec![1, 2], 2, 0.1)).unwrap();
    s.add_request(on(3, vec![1, 2], 3, 0.2)).unwrap();
    s.add_request(on(4, vec![1, 2], 0, 0.3)).unwrap();
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(plan.req_ids, vec![1, 2]);
    s.add_request(on(5, vec![1, 2], 1, 0.05)).unwrap(); // arrives before 3 in rank order
    let (plan, _) = step(&mut s, 1.0, 5);
    assert_eq!(plan.req_ids, vec![1, 2, 5]);
    let mut admitted_3 = None;
    for i in 0..8 {
        let (plan, out) = step(&mut s, 1.0, 5);
        let running: Vec<u32> = plan.lora_ids.iter().copied().filter(|&l| l != 0).collect();
        let mut distinct = running.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() <= 2, "step {i}: {:?}", plan.lora_ids);
        if admitted_3.is_none() && plan.req_ids.contains(&3) {
            admitted_3 = Some(i);
        }
        let _ = out;
    }
    assert!(
        admitted_3.is_some(),
        "adapter 3 runs once an adapter's requests have ended"
    );
    while s.has_unfinished_requests() {
        step(&mut s, 1.0, 5);
    }
}

#[test]
fn no_limit_by_default() {
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    for id in 1..=5 {
        s.add_request(on(id, vec![1, 2], id as u32, 0.0)).unwrap();
    }
    let (plan, _) = step(&mut s, 0.0, 5);
    assert_eq!(plan.lora_ids, vec![1, 2, 3, 4, 5]);
}
