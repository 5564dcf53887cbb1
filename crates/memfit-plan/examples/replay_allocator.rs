//! Replays a recorded trace of PyTorch's CUDA caching allocator through memfit's replay of its
//! rules (`memory/caching_allocator.rs`) and prints, per step, the reserved bytes the card
//! reported and those the replay holds: where the two part, the replay's rules are not the card's.
//!
//! The trace is `scripts/measure_gpu_memory.py --trace-steps K --trace-dir DIR` (gzip: pipe it in):
//!     zcat DIR/ID.trace.gz | cargo run --release -p memfit-plan --example replay_allocator
//!     ... --example replay_allocator -- --expandable-segments   (a run under expandable_segments)

use memfit_plan::memory::caching_allocator::replay_trace;

fn main() -> Result<(), String> {
    let expandable = std::env::args().any(|a| a == "--expandable-segments");
    let replay = replay_trace(std::io::stdin().lock(), expandable)?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("step\tcard reserved MiB\treplay reserved MiB\tcard peak\treplay peak");
    for p in &replay.points {
        println!(
            "{}\t{:.1}\t{:.1}\t{:.1}\t{:.1}",
            p.step,
            mib(p.card_reserved),
            mib(p.replay_reserved),
            mib(p.card_peak),
            mib(p.replay_peak)
        );
    }
    if replay.unknown_frees > 0 {
        eprintln!(
            "{} frees of blocks allocated before the trace began (not replayed)",
            replay.unknown_frees
        );
    }
    Ok(())
}
