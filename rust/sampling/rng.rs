//! The counter-based random stream: a draw's uniform is a pure function of (seed, sample index,
//! position), so a seeded request draws the same tokens whatever else shares its batch, in any
//! order, on any number of threads, and again after preemption recomputes it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The uniform in [0, 1) for the draw of sample `sample_index` at `position` (the number of
/// tokens it has generated so far) under `seed`: the top 53 bits of
/// `xxh3_64_with_seed(sample_index LE u32 ++ position LE u64, seed)`.
pub fn uniform(seed: u64, sample_index: u32, position: u64) -> f64 {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&sample_index.to_le_bytes());
    key[4..].copy_from_slice(&position.to_le_bytes());
    let bits = xxh3_64_with_seed(&key, seed) >> 11;
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_changes_the_draw_and_values_look_uniform() {
        let u = uniform(7, 0, 0);
        assert_eq!(u, uniform(7, 0, 0));
        assert_ne!(u, uniform(8, 0, 0));
        assert_ne!(u, uniform(7, 1, 0));
        assert_ne!(u, uniform(7, 0, 1));
        // Means of 100k draws are within 5 standard errors of 1/2; every value is in [0, 1).
        let draws: Vec<f64> = (0..100_000).map(|p| uniform(42, 3, p)).collect();
        assert!(draws.iter().all(|&d| (0.0..1.0).contains(&d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 5.0 * (1.0 / 12.0f64).sqrt() / 100_000f64.sqrt());
    }
}
