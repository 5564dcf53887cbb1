//! How much more the caching allocator reserves when step lengths vary than at a fixed length,
//! by replaying a step's main tensors through `memory/caching_allocator.rs`: the blocks'
//! checkpointed inputs, one block's forward under no_grad and its recomputation and backward
//! (the attention's projections and output, the feed-forward's three intermediates), and the
//! loss as transformers computed it in 2023 (bf16 logits, their shifted copy, the fp32 cast and
//! log-softmax; in backward the NLL and log-softmax gradients, the bf16 cast, the unshifted
//! gradient). A model of a step, not a trace: the figures in docs/accuracy.md ("Varying lengths")
//! come from it, and `scripts/gpu/pool.sh` measures what it stands for.
//!
//! `cargo run --release -p memfit-plan --example pool_growth -- [STEPS]` (default 100): Qwen-1.8B's
//! shapes, batch 1, lengths ln-normal with ms-swift's cls-fudan-news-zh mean and spread (3,234 ±
//! 2,547 tokens), cut to [91, seq].

use memfit_plan::memory::caching_allocator::CachingAllocator;

const GIB: f64 = (1u64 << 30) as f64;

struct Shapes {
    hidden: u64,
    ffn: u64,
    layers: u64,
    vocab: u64,
}

const QWEN_1_8B: Shapes = Shapes {
    hidden: 2048,
    ffn: 5504,
    layers: 24,
    vocab: 151_936,
};

fn main() {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    println!("seq\tfixed GiB\tvarying GiB\textra GiB\t({steps} steps)");
    for seq in [512u64, 1024, 2048, 4096, 8192] {
        let fixed = reserved(&QWEN_1_8B, &[seq; 3]);
        let lengths = fudan_lengths(seq, steps);
        let varying = reserved(&QWEN_1_8B, &lengths);
        println!(
            "{seq}\t{:.2}\t{:.2}\t{:.2}",
            fixed as f64 / GIB,
            varying as f64 / GIB,
            (varying - fixed) as f64 / GIB
        );
    }
}

fn reserved(s: &Shapes, lengths: &[u64]) -> u64 {
    let mut a = CachingAllocator::new(false);
    for &len in lengths {
        step(&mut a, s, len);
    }
    a.stats().peak_reserved
}

/// One training step at `len` tokens (bf16: 2 bytes an element), LoRA on a frozen base with
/// reentrant checkpointing per block.
fn step(a: &mut CachingAllocator, s: &Shapes, len: u64) {
    let (h, f, v) = (2 * len * s.hidden, 2 * len * s.ffn, len * s.vocab);
    let mut inputs = vec![a.malloc(h)];
    for _ in 0..s.layers {
        let qkv = a.malloc(3 * h);
        let attn = a.malloc(h);
        a.free(qkv);
        let (gate, up) = (a.malloc(f), a.malloc(f));
        let act = a.malloc(f);
        a.free(gate);
        a.free(up);
        let out = a.malloc(h);
        a.free(act);
        a.free(attn);
        inputs.push(out);
    }
    let shifted = (len - 1) * s.vocab;
    let logits = a.malloc(2 * v);
    let copy = a.malloc(2 * shifted);
    let upcast = a.malloc(4 * shifted);
    let log_softmax = a.malloc(4 * shifted);
    for t in [upcast, copy, logits] {
        a.free(t);
    }
    let nll_grad = a.malloc(4 * shifted);
    let grad = a.malloc(4 * shifted);
    a.free(nll_grad);
    a.free(log_softmax);
    let grad16 = a.malloc(2 * shifted);
    a.free(grad);
    let unshifted = a.malloc(2 * v);
    a.free(grad16);
    let mut grad_hidden = a.malloc(h);
    a.free(unshifted);
    for _ in 0..s.layers {
        let saved: Vec<u64> = [h, h, h, h, 3 * h, f, f, f]
            .into_iter()
            .map(|b| a.malloc(b))
            .collect();
        let g1 = a.malloc(f);
        let g2 = a.malloc(f);
        a.free(g1);
        let next = a.malloc(h);
        a.free(g2);
        saved.into_iter().for_each(|t| a.free(t));
        a.free(grad_hidden);
        grad_hidden = next;
        a.free(inputs.pop().expect("a block input"));
    }
    a.free(grad_hidden);
    inputs.into_iter().for_each(|t| a.free(t));
}

/// `steps` lengths with ln(length) normal (cls-fudan-news-zh's mean 3,234 and sd 2,547 tokens),
/// kept when in [91, seq]: a fixed seed, SplitMix64 and Box–Muller.
fn fudan_lengths(seq: u64, steps: usize) -> Vec<u64> {
    let (mean, sd) = (3234.0f64, 2547.0f64);
    let sigma2 = (1.0 + (sd / mean).powi(2)).ln();
    let (mu, sigma) = (mean.ln() - sigma2 / 2.0, sigma2.sqrt());
    let mut state = 42u64;
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(steps);
    while out.len() < steps {
        let (u1, u2) = (uniform().max(f64::MIN_POSITIVE), uniform());
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let len = (mu + sigma * normal).exp().round() as u64;
        if (91..=seq).contains(&len) {
            out.push(len);
        }
    }
    out
}
