//! Full planner search for a 7B model (one budget) and a whole tier table for a small model.
//! `cargo bench -p memfit-plan --bench plan`

use criterion::{Criterion, criterion_group, criterion_main};
use memfit_plan::arch::preset;
use memfit_plan::memory::{Framework, Setup};
use memfit_plan::search::{Budget, Request, plan, tiers};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let fw = Framework::default();
    let llama = preset("llama-2-7b").unwrap();
    let req = Request {
        base: Setup::new(&llama),
        target_batch: 64,
        budget: Budget {
            gpu_bytes: Some(80 << 30),
            host_bytes: 256 << 30,
            headroom: 0.1,
        },
    };
    c.bench_function("plan llama-2-7b full search", |b| {
        b.iter(|| plan(black_box(&llama), black_box(&req), &fw).unwrap())
    });
    let mini = preset("chatlm-mini").unwrap();
    let base = Setup::new(&mini);
    c.bench_function("tier table chatlm-mini (40 plans)", |b| {
        b.iter(|| tiers::tier_table(black_box(&mini), &base, 32, 0.1, &fw).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
