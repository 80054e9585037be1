//! Criterion benches of the block pool alone: allocate + free, and a cache hit (lookup + incref
//! + free) on a warm prefix.

use _core::kv::{block_hash, root_hash, BlockPool, CacheKey};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("block_pool");
    group.throughput(Throughput::Elements(16));
    let mut pool = BlockPool::new(100_000, 16);
    let mut blocks = Vec::with_capacity(16);
    group.bench_function("allocate_free_16", |b| {
        b.iter(|| {
            blocks.clear();
            assert!(pool.allocate_into(16, &mut blocks));
            pool.free(std::hint::black_box(&blocks));
        })
    });
    let tokens: Vec<u32> = (0..16).collect();
    let hash = block_hash(root_hash(None), &tokens);
    let mut got = Vec::new();
    pool.allocate_into(1, &mut got);
    pool.insert(got[0], hash, &tokens, CacheKey::Root(None), None);
    pool.free(&got);
    group.throughput(Throughput::Elements(1));
    group.bench_function("hash_lookup_hit_16_tokens", |b| {
        b.iter(|| {
            let h = block_hash(root_hash(None), std::hint::black_box(&tokens));
            let hit = pool
                .lookup(h, &tokens, &CacheKey::Root(None), None)
                .unwrap();
            pool.incref(hit);
            pool.free(&[hit]);
        })
    });
    group.finish();
}

criterion_group!(benches, alloc_free);
criterion_main!(benches);
