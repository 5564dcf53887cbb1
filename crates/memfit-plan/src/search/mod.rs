//! The planner: enumerate the setup space, estimate each setup, keep those within the budgets,
//! rank by the [`throughput`] model.
//!
//! Searched: micro-batch (powers of two dividing the per-rank target batch; accumulation makes up
//! the rest so the effective batch is held), precision, gradient checkpointing, ZeRO stage and
//! offload, loader workers and pinned memory. Fixed by the request: model, task, lengths, method
//! (LoRA/QLoRA/freeze settings), optimizer, runtime, GPU count.

pub mod data_parallel;
pub mod policy;
pub mod throughput;
pub mod tiers;

use crate::arch::Arch;
use crate::memory::{self, Device, Estimate, Framework, Precision, Setup, Zero};
use serde::Serialize;

/// What the machine offers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// Memory of each GPU; `None` trains on the CPU.
    pub gpu_bytes: Option<u64>,
    pub host_bytes: u64,
    /// Fraction kept free on both (0.10 = plan for 90%).
    pub headroom: f64,
}

impl Budget {
    pub fn usable_gpu(&self) -> Option<u64> {
        self.gpu_bytes
            .map(|g| (g as f64 * (1.0 - self.headroom)) as u64)
    }
    pub fn usable_host(&self) -> u64 {
        (self.host_bytes as f64 * (1.0 - self.headroom)) as u64
    }
}

/// A planning request: the fixed part of the setup and the effective batch to hold.
#[derive(Debug, Clone)]
pub struct Request {
    /// Carries task, lengths, method, LoRA, freeze, optimizer, runtime, gpus, nodes, attention.
    pub base: Setup,
    /// Samples per optimizer step over all ranks.
    pub target_batch: u64,
    pub budget: Budget,
}

/// Settings the user fixed: the search keeps only setups that agree with them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Fixed {
    pub batch: Option<u64>,
    pub accum: Option<u64>,
    /// The sequence length (the search never changes it; a policy may).
    pub seq: Option<u64>,
    pub precision: Option<Precision>,
    pub grad_ckpt: Option<bool>,
}

impl Fixed {
    fn allows(&self, s: &Setup) -> bool {
        self.batch.is_none_or(|b| b == s.batch)
            && self.accum.is_none_or(|a| a == s.accum)
            && self.seq.is_none_or(|q| q == s.seq)
            && self.precision.is_none_or(|p| p == s.precision)
            && self.grad_ckpt.is_none_or(|g| g == s.grad_ckpt)
    }
}

/// One evaluated setup.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub setup: Setup,
    pub estimate: Estimate,
    pub tokens_per_s: f64,
    /// Why it does not fit; `None` when it does.
    pub rejected: Option<String>,
}

impl Candidate {
    /// The memory the budget is compared with: what nvidia-smi would show, and host RSS.
    pub fn gpu_need(&self) -> Option<u64> {
        self.estimate.gpu.as_ref().map(|g| g.nvml_used_bytes)
    }
    /// The GPU need widened by the validation band of the setup's class (`memory::band`): the
    /// planner keeps this free on top of the headroom.
    pub fn gpu_need_banded(&self) -> Option<u64> {
        self.gpu_need().map(|n| memory::band::high(n, &self.setup))
    }
    pub fn host_need(&self) -> u64 {
        self.estimate.host.peak_rss_bytes
    }
    /// A one-line description: "micro 8 × accum 4, amp-bf16, grad ckpt, zero 2 + offload opt".
    pub fn summary(&self) -> String {
        let s = &self.setup;
        let mut out = format!("micro {} × accum {}, {}", s.batch, s.accum, s.precision);
        if s.grad_ckpt {
            out += ", grad ckpt";
        }
        if s.zero != Zero::Z0 {
            out += &format!(", zero {}", s.zero);
        }
        if s.offload_optimizer {
            out += " + offload opt";
        }
        if s.offload_params {
            out += " + offload params";
        }
        out += &format!(", {} worker(s)", s.workers);
        if s.pin_memory {
            out += ", pinned";
        }
        out
    }
}

/// The planner's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub chosen: Option<Candidate>,
    /// Next best fitting setups, fastest first.
    pub alternatives: Vec<Candidate>,
    /// The fastest setups that did not fit, with the reason.
    pub rejected: Vec<Candidate>,
    pub considered: usize,
    /// Set when nothing fits: the leanest setup's shortfall.
    pub reason: Option<String>,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Micro-batches to try: powers of two dividing the per-rank batch, and the per-rank batch itself.
fn micro_batches(per_rank: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..20)
        .map(|i| 1u64 << i)
        .filter(|m| *m <= per_rank && per_rank.is_multiple_of(*m))
        .collect();
    if !v.contains(&per_rank) && per_rank > 0 {
        v.push(per_rank);
    }
    v
}

/// Sharding options. On one GPU ZeRO partitions nothing, but ZeRO-2 still runs DeepSpeed's 16-bit
/// model (fp32 master weights in the optimizer), which halves frozen weights: it is searched there
/// too, so that an offload is always weighed against the same setup without it and only wins when
/// the memory it moves off the GPU buys something.
///
/// A base setup that names FSDP (`memfit plan --sharding fsdp2|fsdp1`) searches FSDP's options
/// instead: none (DDP), SHARD_GRAD_OP, FULL_SHARD, and FULL_SHARD with FSDP's CPU offload, which
/// moves parameters and gradients and steps the optimizer on the host (both offloads at once).
fn zero_options(setup: &Setup) -> Vec<(Zero, bool, bool)> {
    // memfit's trainer has no ZeRO stages or offload to choose among (its --shard-optimizer is
    // fixed by the flag and planned per rank: `Setup::optimizer_shards`)
    if setup.device == Device::Cpu || setup.runtime == memory::Runtime::Memfit {
        return vec![(Zero::Z0, false, false)];
    }
    if setup.zero.is_fsdp() {
        let mut v = vec![(Zero::Z0, false, false)];
        if setup.world() > 1 {
            v.extend([
                (Zero::FsdpGradOp, false, false),
                (Zero::FsdpFull, false, false),
            ]);
        }
        v.push((Zero::FsdpFull, true, true));
        return v;
    }
    let mut v = vec![(Zero::Z0, false, false)];
    if setup.world() > 1 {
        v.extend([
            (Zero::Z1, false, false),
            (Zero::Z2, false, false),
            (Zero::Z3, false, false),
        ]);
    } else {
        v.push((Zero::Z2, false, false));
    }
    v.extend([
        (Zero::Z2, true, false),
        (Zero::Z3, true, false),
        (Zero::Z3, true, true),
    ]);
    v
}

fn precisions(base: &Setup) -> &'static [Precision] {
    match (base.runtime, base.device) {
        // memfit's bf16 on a GPU is mixed precision (f32 masters), one precision it names bf16
        (memory::Runtime::Memfit, Device::Cuda) => &[Precision::Bf16, Precision::Fp32],
        // amp-fp16 costs what amp-bf16 costs; bf16-capable GPUs are assumed (emit fp16 by hand for V100)
        (_, Device::Cuda) => &[Precision::AmpBf16, Precision::Fp32],
        (_, Device::Cpu) => &[Precision::Fp32, Precision::Bf16],
    }
}

/// Runs the search.
pub fn plan(arch: &Arch, req: &Request, fw: &Framework) -> Result<Plan, String> {
    plan_with(arch, req, fw, &Fixed::default())
}

/// Loader options: memfit's trainer reads its memory-mapped token store on the training thread
/// (no loader workers, nothing to pin); a PyTorch DataLoader can have workers and pinned memory.
fn loader_options(setup: &Setup) -> &'static [(u64, bool)] {
    match (setup.runtime, setup.device) {
        (memory::Runtime::Memfit, _) => &[(0, false)],
        (_, Device::Cpu) => &[(0, false), (2, false)],
        _ => &[(0, false), (2, false), (2, true)],
    }
}

/// Runs the search, keeping only setups that agree with `fixed`. Micro-batches that do not divide
/// the target batch are still tried when fixed (accumulation then rounds up).
pub fn plan_with(
    arch: &Arch,
    req: &Request,
    fw: &Framework,
    fixed: &Fixed,
) -> Result<Plan, String> {
    let mut base = req.base.clone();
    base.device = if req.budget.gpu_bytes.is_some() {
        Device::Cuda
    } else {
        Device::Cpu
    };
    if base.device == Device::Cpu {
        base.gpus = 1;
        base.nodes = 1;
    }
    let world = base.world();
    if req.target_batch == 0 || !req.target_batch.is_multiple_of(world) {
        return Err(format!(
            "--target-batch {} must be a positive multiple of the {world} GPU(s)",
            req.target_batch
        ));
    }
    base.validate()?;
    let per_rank = req.target_batch / world;
    // The largest micro-batch tried is the whole batch: bounded once, every candidate is.
    let mut largest = base.clone();
    (largest.batch, largest.accum) = (per_rank, 1);
    memory::magnitude::check(arch, &largest)
        .map_err(|e| e.replace("--batch", "--target-batch (per GPU)"))?;
    let usable_gpu = req.budget.usable_gpu();
    let usable_host = req.budget.usable_host();
    let mut all = Vec::new();
    for &(zero, off_opt, off_params) in &zero_options(&base) {
        for &precision in precisions(&base) {
            for grad_ckpt in [false, true] {
                let mut micros = micro_batches(per_rank);
                if let Some(b) = fixed.batch
                    && !micros.contains(&b)
                {
                    micros.push(b);
                }
                for &micro in &micros {
                    for &(workers, pin) in loader_options(&base) {
                        let mut s = base.clone();
                        s.zero = zero;
                        s.offload_optimizer = off_opt;
                        s.offload_params = off_params;
                        s.precision = precision;
                        s.grad_ckpt = grad_ckpt;
                        s.batch = micro;
                        s.accum = per_rank.div_ceil(micro).max(1);
                        s.workers = workers;
                        s.pin_memory = pin;
                        if !fixed.allows(&s) {
                            continue;
                        }
                        let Ok(estimate) = memory::estimate(arch, &s, fw) else {
                            continue;
                        };
                        let tokens_per_s = throughput::tokens_per_second(arch, &s);
                        let mut c = Candidate {
                            setup: s,
                            estimate,
                            tokens_per_s,
                            rejected: None,
                        };
                        c.rejected = rejection(&c, usable_gpu, usable_host, &req.budget);
                        all.push(c);
                    }
                }
            }
        }
    }
    let considered = all.len();
    sort_by_preference(&mut all);
    let (fits, misses): (Vec<_>, Vec<_>) = all.into_iter().partition(|c| c.rejected.is_none());
    let reason = fits.is_empty().then(|| nothing_fits(&misses));
    let chosen_speed = fits.first().map_or(f64::INFINITY, |c| c.tokens_per_s);
    let mut fits = fits.into_iter();
    let chosen = fits.next();
    let alternatives = distinct(fits, chosen.as_ref(), 3);
    // the rejected setups that would have been faster than the choice
    let rejected = misses
        .into_iter()
        .filter(|c| c.tokens_per_s >= chosen_speed || chosen_speed.is_infinite())
        .take(3)
        .collect();
    Ok(Plan {
        chosen,
        alternatives,
        rejected,
        considered,
        reason,
    })
}

/// Fastest first; ties → the setup with fewer parts (no ZeRO, no offload: one GPU's ZeRO-2 ties
/// with the plain setup), then less GPU memory, then less host memory.
fn sort_by_preference(candidates: &mut [Candidate]) {
    let parts = |c: &Candidate| {
        let s = &c.setup;
        (s.zero != Zero::Z0, s.offload_optimizer, s.offload_params)
    };
    candidates.sort_by(|a, b| {
        b.tokens_per_s
            .total_cmp(&a.tokens_per_s)
            .then(parts(a).cmp(&parts(b)))
            .then(a.gpu_need().cmp(&b.gpu_need()))
            .then(a.host_need().cmp(&b.host_need()))
    });
}

/// Why a search found no fitting setup: what keeps the leanest of them out.
fn nothing_fits(misses: &[Candidate]) -> String {
    let leanest = misses
        .iter()
        .min_by_key(|c| (c.gpu_need().unwrap_or(0), c.host_need()));
    match leanest {
        Some(c) => format!(
            "nothing fits: the leanest setup ({}) {}",
            c.summary(),
            c.rejected.clone().unwrap_or_default()
        ),
        None => "nothing fits: no setup could be estimated".to_string(),
    }
}

/// Estimates one fixed setup (a preset's) against the budget, as the search estimates each of
/// its candidates: `rejected` says why it does not fit. Without a GPU budget, a GPU setup is
/// checked against the host budget only.
pub fn evaluate(
    arch: &Arch,
    setup: Setup,
    budget: &Budget,
    fw: &Framework,
) -> Result<Candidate, String> {
    setup.validate()?;
    let estimate = memory::estimate(arch, &setup, fw)?;
    let tokens_per_s = throughput::tokens_per_second(arch, &setup);
    let mut c = Candidate {
        setup,
        estimate,
        tokens_per_s,
        rejected: None,
    };
    c.rejected = rejection(&c, budget.usable_gpu(), budget.usable_host(), budget);
    Ok(c)
}

/// Up to `n` alternatives that differ from the choice (and each other) in more than the loader.
fn distinct(
    rest: impl Iterator<Item = Candidate>,
    chosen: Option<&Candidate>,
    n: usize,
) -> Vec<Candidate> {
    let key = |c: &Candidate| {
        let s = &c.setup;
        (
            s.batch,
            s.precision,
            s.grad_ckpt,
            s.zero,
            s.offload_optimizer,
            s.offload_params,
        )
    };
    let mut seen: Vec<_> = chosen.map(key).into_iter().collect();
    let mut out = Vec::new();
    for c in rest {
        if seen.contains(&key(&c)) {
            continue;
        }
        seen.push(key(&c));
        out.push(c);
        if out.len() == n {
            break;
        }
    }
    out
}

fn rejection(
    c: &Candidate,
    usable_gpu: Option<u64>,
    usable_host: u64,
    budget: &Budget,
) -> Option<String> {
    let mut why = Vec::new();
    if let (Some(need), Some(banded), Some(have)) = (c.gpu_need(), c.gpu_need_banded(), usable_gpu)
        && banded > have
    {
        let band = memory::band::for_setup(&c.setup);
        why.push(format!(
            "needs {:.2} GiB per GPU, {:.2} GiB with the {:.0}% validation band of {} > {:.2} GiB usable ({:.0}% headroom of {:.2} GiB)",
            need as f64 / GIB,
            banded as f64 / GIB,
            100.0 * band.width,
            band.class,
            have as f64 / GIB,
            100.0 * budget.headroom,
            budget.gpu_bytes.unwrap_or(0) as f64 / GIB
        ));
    }
    if c.host_need() > usable_host {
        why.push(format!(
            "needs {:.2} GiB host RAM > {:.2} GiB usable",
            c.host_need() as f64 / GIB,
            usable_host as f64 / GIB
        ));
    }
    if why.is_empty() {
        None
    } else {
        Some(why.join("; "))
    }
}
