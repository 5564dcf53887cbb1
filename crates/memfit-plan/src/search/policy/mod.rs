//! Named policies (`--policy NAME`): tables of available-memory thresholds, each setting a few
//! knobs once before training, and fixed presets (one catch-all rule: the same settings on any
//! machine). `auto` (the planner) is not a policy. The tables themselves are in [`table`].
//!
//! A policy is read top to bottom: the first row whose threshold is above the available memory
//! applies; when none does, the configured values stay. "Available" is what the seed read,
//! `psutil.virtual_memory().available` in GiB (it divided by 1024³ and called it GB).
//!
//! Where the seed's tables come from: its `model/trainer_low_mem.py` (ylan2009/ChatLM-mini-Chinese),
//! which chose these knobs differently from one revision to the next; `chatlm-vN` is its N-th
//! revision. Its evaluation batch (v3: 2, or min(2 × batch, 4)) has no counterpart here: memfit
//! evaluates at the training micro-batch.

mod table;

use super::Fixed;
use crate::Task;
use crate::memory::{Method, Precision, Runtime, Setup, Zero};
use serde::Serialize;
pub use table::POLICIES;

const GIB: u64 = 1 << 30;

/// How a row sets a numeric knob, given the configured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// This value.
    Set(u64),
    /// The configured value, raised to at least this.
    AtLeast(u64),
    /// The configured value, lowered to at most this.
    AtMost(u64),
}

impl Knob {
    /// The knob's value for a run configured with `configured`.
    pub fn apply(self, configured: u64) -> u64 {
        match self {
            Knob::Set(v) => v,
            Knob::AtLeast(v) => configured.max(v),
            Knob::AtMost(v) => configured.min(v),
        }
    }

    fn describe(self, what: &str) -> String {
        match self {
            Knob::Set(v) => format!("{what} {v}"),
            Knob::AtLeast(v) => format!("{what} at least {v}"),
            Knob::AtMost(v) => format!("{what} at most {v}"),
        }
    }
}

/// What one row sets (`None`: left as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// Rows per micro-batch (the seed's `batch_size_per_gpu`).
    pub micro_batch: Option<Knob>,
    /// Gradient accumulation steps.
    pub accum: Option<Knob>,
    /// Maximum sequence length in tokens (rows are cut to it).
    pub max_seq: Option<Knob>,
    /// `amp-bf16` is bf16 mixed precision: on memfit's trainer its `bf16` (f32 master weights,
    /// bf16 activations), which is what autocast does.
    pub precision: Option<Precision>,
    pub grad_ckpt: Option<bool>,
    /// DeepSpeed ZeRO stage (the PyTorch stack).
    pub zero: Option<Zero>,
    /// Optimizer states (and, with ZeRO-3, parameters) offloaded to CPU memory.
    pub offload_optimizer: Option<bool>,
    pub offload_params: Option<bool>,
    /// Data-loader worker processes.
    pub workers: Option<u64>,
    /// The seed's "ultra-low-memory" loading: rows read on demand instead of a table in RAM.
    pub low_memory_loading: Option<bool>,
    /// Page-locked (pinned) host buffers for batches.
    pub pin_memory: Option<bool>,
}

impl Settings {
    /// Sets nothing.
    pub const NONE: Settings = Settings {
        micro_batch: None,
        accum: None,
        max_seq: None,
        precision: None,
        grad_ckpt: None,
        zero: None,
        offload_optimizer: None,
        offload_params: None,
        workers: None,
        low_memory_loading: None,
        pin_memory: None,
    };

    /// What it sets, for people: "micro-batch 1, max length 128, accumulation 16, …".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(k) = self.micro_batch {
            parts.push(k.describe("micro-batch"));
        }
        if let Some(k) = self.max_seq {
            parts.push(k.describe("max length"));
        }
        if let Some(k) = self.accum {
            parts.push(k.describe("accumulation"));
        }
        match self.precision {
            Some(Precision::AmpBf16) => parts.push("bf16 mixed precision".into()),
            Some(p) => parts.push(format!("precision {p}")),
            None => {}
        }
        match self.grad_ckpt {
            Some(true) => parts.push("gradient checkpointing".into()),
            Some(false) => parts.push("no gradient checkpointing".into()),
            None => {}
        }
        if let Some(z) = self.zero {
            parts.push(format!("ZeRO-{}", z.stage()));
        }
        let offloaded: Vec<&str> = [
            (self.offload_params, "parameters"),
            (self.offload_optimizer, "optimizer"),
        ]
        .into_iter()
        .filter_map(|(on, what)| (on == Some(true)).then_some(what))
        .collect();
        if !offloaded.is_empty() {
            parts.push(format!("{} offloaded to CPU", offloaded.join(" and ")));
        } else if self.zero.is_some() {
            parts.push("no offload".into());
        }
        if let Some(w) = self.workers {
            parts.push(format!("{w} loader workers"));
        }
        match self.low_memory_loading {
            Some(true) => parts.push("ultra-low-memory loading".into()),
            Some(false) => parts.push("regular loading".into()),
            None => {}
        }
        if self.pin_memory == Some(false) {
            parts.push("no pinned memory".into());
        }
        parts.join(", ")
    }
}

/// One row: applies when the available memory is below `below_available_bytes` (`u64::MAX`: the
/// catch-all row above every threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub below_available_bytes: u64,
    pub set: Settings,
}

/// What a policy is made for; anything else is refused, naming the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Requires {
    /// The task (`None`: any).
    pub task: Option<Task>,
    /// The training method (`None`: any).
    pub method: Option<Method>,
    /// The trainers it sets up: memfit's own (`memfit train`, `--runtime memfit`) and/or a
    /// PyTorch process (`memfit plan --runtime pytorch`).
    pub runtimes: &'static [Runtime],
}

/// A named policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub name: &'static str,
    /// Where the table comes from.
    pub source: &'static str,
    pub requires: Requires,
    pub rules: &'static [Rule],
}

impl Policy {
    /// A fixed preset: one catch-all rule, the same settings whatever the machine has.
    pub fn preset(&self) -> Option<&'static Settings> {
        match self.rules {
            [only] if only.below_available_bytes == u64::MAX => Some(&only.set),
            _ => None,
        }
    }

    /// Whether it sets up `runtime`'s trainer; the error names the policy and what does take it.
    pub fn check_runtime(&self, runtime: Runtime) -> Result<(), String> {
        if self.requires.runtimes.contains(&runtime) {
            return Ok(());
        }
        let (this, other) = match runtime {
            Runtime::Memfit => (
                "memfit's own trainer (memfit train, --runtime memfit)",
                format!("the PyTorch stack: memfit plan --policy {}", self.name),
            ),
            Runtime::Pytorch => (
                "the PyTorch stack (--runtime pytorch)",
                format!("memfit's trainer: memfit train --policy {}", self.name),
            ),
        };
        Err(format!(
            "--policy {}: not a policy for {this}; it is for {other}. Policies here: {}",
            self.name,
            names_for(runtime)
        ))
    }

    /// Whether it fits a run of `task` trained by `method`; the error names both.
    pub fn check_run(&self, task: Task, method: Method) -> Result<(), String> {
        if let Some(want) = self.requires.task.filter(|t| *t != task) {
            return Err(format!(
                "--policy {} is for {} runs; this run's task is {} (pick another --policy, or \
                 --task {})",
                self.name,
                want.as_str(),
                task.as_str(),
                want.as_str()
            ));
        }
        if let Some(want) = self.requires.method.filter(|m| *m != method) {
            return Err(format!(
                "--policy {} is a preset for --method {want}; this run's method is {method} (add \
                 --method {want})",
                self.name
            ));
        }
        Ok(())
    }
}

/// The policy names `--policy` takes for `runtime`'s trainer, `auto` first.
pub fn names_for(runtime: Runtime) -> String {
    names_where(|p| p.requires.runtimes.contains(&runtime))
}

/// The fixed presets for `runtime`'s trainer (what `memfit plan --policy` estimates), `auto` first.
pub fn preset_names_for(runtime: Runtime) -> String {
    names_where(|p| p.requires.runtimes.contains(&runtime) && p.preset().is_some())
}

fn names_where(keep: impl Fn(&Policy) -> bool) -> String {
    std::iter::once("auto")
        .chain(POLICIES.iter().filter(|p| keep(p)).map(|p| p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The policy called `name` (not `auto`).
pub fn find(name: &str) -> Option<&'static Policy> {
    POLICIES.iter().find(|p| p.name == name)
}

/// What a policy decided for a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub policy: &'static str,
    pub available_bytes: u64,
    /// The row that applied (its threshold), `None`: the configured values stay.
    pub rule: Option<Rule>,
    /// A fixed preset: its one row applies on any machine.
    pub preset: bool,
}

impl Decision {
    /// One line for people: "chatlm-v8: 6.00 GiB available < 10.00 GiB → accumulation 4, …", or
    /// "bert-safe (a fixed preset) → micro-batch 4, max length 256, accumulation 4".
    pub fn describe(&self) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / GIB as f64);
        let available = gib(self.available_bytes);
        let Some(r) = &self.rule else {
            return format!(
                "{}: {available} available — no row applies, the configured values stay",
                self.policy
            );
        };
        if self.preset {
            return format!("{} (a fixed preset) → {}", self.policy, r.set.describe());
        }
        let condition = if r.below_available_bytes == u64::MAX {
            format!("{available} available, above every threshold")
        } else {
            format!("{available} available < {}", gib(r.below_available_bytes))
        };
        format!("{}: {condition} → {}", self.policy, r.set.describe())
    }
}

/// Applies `policy` to a machine with `available_bytes`.
pub fn decide(policy: &'static Policy, available_bytes: u64) -> Decision {
    Decision {
        policy: policy.name,
        available_bytes,
        rule: policy
            .rules
            .iter()
            .find(|r| available_bytes < r.below_available_bytes)
            .copied(),
        preset: policy.preset().is_some(),
    }
}

/// Sets what `set` sets on `setup`, except what the user fixed by a flag (`fixed`): the flag wins
/// and a note says so. On memfit's trainer bf16 mixed precision is its `bf16` (it has no autocast).
pub fn apply(set: &Settings, setup: &mut Setup, fixed: &Fixed) -> Vec<String> {
    let mut notes = Vec::new();
    let knobs = [
        (
            set.micro_batch,
            fixed.batch,
            &mut setup.batch,
            "micro-batch",
            "--batch",
        ),
        (
            set.accum,
            fixed.accum,
            &mut setup.accum,
            "accumulation",
            "--accum",
        ),
        (
            set.max_seq,
            fixed.seq,
            &mut setup.seq,
            "max length",
            "--seq",
        ),
    ];
    for (knob, flag, value, what, flag_name) in knobs {
        let Some(knob) = knob else { continue };
        let wanted = knob.apply(*value);
        match flag {
            None => *value = wanted,
            Some(f) if f != wanted => notes.push(format!(
                "{what} stays {f} (set by {flag_name}) instead of the policy's {wanted}"
            )),
            Some(_) => {}
        }
    }
    if let Some(mut p) = set.precision {
        if setup.runtime == Runtime::Memfit && p.is_amp() {
            p = Precision::Bf16;
        }
        match fixed.precision {
            None => setup.precision = p,
            Some(f) if f != p => notes.push(format!(
                "precision stays {f} (set by --precision) instead of the policy's {p}"
            )),
            Some(_) => {}
        }
    }
    if let Some(g) = set.grad_ckpt {
        match fixed.grad_ckpt {
            None => setup.grad_ckpt = g,
            Some(f) if f != g => notes.push(format!(
                "gradient checkpointing stays {} (set by --grad-ckpt) instead of the policy's {}",
                on_off(f),
                on_off(g)
            )),
            Some(_) => {}
        }
    }
    // ZeRO, offload and the loader: no flag of memfit train or memfit plan fixes these
    setup.zero = set.zero.unwrap_or(setup.zero);
    setup.offload_optimizer = set.offload_optimizer.unwrap_or(setup.offload_optimizer);
    setup.offload_params = set.offload_params.unwrap_or(setup.offload_params);
    setup.workers = set.workers.unwrap_or(setup.workers);
    setup.pin_memory = set.pin_memory.unwrap_or(setup.pin_memory);
    notes
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatlm_v8_switches_at_10_gib() {
        let v8 = find("chatlm-v8").unwrap();
        let low = decide(v8, 6 * GIB);
        let set = low.rule.unwrap().set;
        assert_eq!(set.accum, Some(Knob::Set(4)));
        assert_eq!(set.micro_batch, None);
        assert_eq!(set.workers, Some(0));
        assert_eq!(set.low_memory_loading, Some(true));
        assert_eq!(set.pin_memory, Some(false));
        assert!(
            low.describe().contains("accumulation 4"),
            "{}",
            low.describe()
        );
        assert_eq!(decide(v8, 10 * GIB).rule, None);
        assert_eq!(decide(v8, 64 * GIB).rule, None);
    }

    #[test]
    fn chatlm_v3_switches_at_13_gib_and_bounds_the_knobs_above() {
        let v3 = find("chatlm-v3").unwrap();
        let low = decide(v3, 12 * GIB).rule.unwrap().set;
        assert_eq!(
            (low.micro_batch, low.accum),
            (Some(Knob::Set(1)), Some(Knob::Set(8)))
        );
        assert_eq!(low.low_memory_loading, Some(true));
        let high = decide(v3, 13 * GIB);
        let set = high.rule.unwrap().set;
        assert_eq!(set.low_memory_loading, Some(false));
        // configured 16 × 2: at most 2 rows, at least 16 accumulation steps
        assert_eq!(set.micro_batch.unwrap().apply(16), 2);
        assert_eq!(set.accum.unwrap().apply(2), 16);
        // configured 1 × 32 stays
        assert_eq!(set.micro_batch.unwrap().apply(1), 1);
        assert_eq!(set.accum.unwrap().apply(32), 32);
        assert!(
            high.describe().contains("above every threshold"),
            "{}",
            high.describe()
        );
        assert!(find("auto").is_none());
        assert_eq!(
            names_for(Runtime::Memfit),
            "auto, chatlm-v8, chatlm-v3, bert-ultra-low, bert-safe, bert-original"
        );
        assert_eq!(
            names_for(Runtime::Pytorch),
            "auto, bert-ultra-low, bert-safe, bert-original, qwen-deepspeed, \
             qwen-stage2-offload, qwen-stage3, qwen-minimal"
        );
    }

    fn bert_setup(runtime: Runtime) -> Setup {
        let arch = crate::arch::preset("bert-base-chinese").unwrap();
        let mut s = Setup::new(&arch);
        s.runtime = runtime;
        s
    }

    #[test]
    fn bert_tiers_are_fixed_presets_for_classification() {
        let tiers = [
            ("bert-ultra-low", 1, 128, 16),
            ("bert-safe", 4, 256, 4),
            ("bert-original", 8, 512, 1),
        ];
        for (name, micro, seq, accum) in tiers {
            let p = find(name).unwrap();
            assert!(p.preset().is_some(), "{name}");
            // any machine: the same row
            assert_eq!(decide(p, GIB).rule, decide(p, 512 * GIB).rule);
            let mut s = bert_setup(Runtime::Pytorch);
            assert!(apply(p.preset().unwrap(), &mut s, &Fixed::default()).is_empty());
            assert_eq!((s.batch, s.seq, s.accum), (micro, seq, accum), "{name}");
            assert!(p.source.contains("issue 14"), "{name}");
            p.check_run(Task::Classification, Method::Full).unwrap();
            p.check_runtime(Runtime::Memfit).unwrap();
            let err = p.check_run(Task::Seq2seq, Method::Full).unwrap_err();
            assert!(err.contains(name) && err.contains("seq2seq"), "{err}");
        }
        let ultra = find("bert-ultra-low").unwrap();
        let described = decide(ultra, 6 * GIB).describe();
        assert_eq!(
            described,
            "bert-ultra-low (a fixed preset) → micro-batch 1, max length 128, accumulation 16, \
             bf16 mixed precision, gradient checkpointing, 0 loader workers"
        );
        // memfit's trainer has no autocast: its bf16 is the mixed precision
        let mut s = bert_setup(Runtime::Memfit);
        apply(ultra.preset().unwrap(), &mut s, &Fixed::default());
        assert_eq!(
            (s.precision, s.grad_ckpt, s.workers),
            (Precision::Bf16, true, 0)
        );
        let mut s = bert_setup(Runtime::Pytorch);
        apply(ultra.preset().unwrap(), &mut s, &Fixed::default());
        assert_eq!(s.precision, Precision::AmpBf16);
        // flags win, and say so
        let fixed = Fixed {
            seq: Some(64),
            grad_ckpt: Some(false),
            ..Fixed::default()
        };
        let mut s = bert_setup(Runtime::Memfit);
        s.seq = 64;
        let notes = apply(ultra.preset().unwrap(), &mut s, &fixed);
        assert_eq!((s.seq, s.grad_ckpt), (64, false));
        assert!(
            notes[0].contains("max length stays 64 (set by --seq)"),
            "{notes:?}"
        );
        assert!(notes[1].contains("(set by --grad-ckpt)"), "{notes:?}");
    }

    #[test]
    fn qwen_tiers_set_zero_and_offload_for_lora_on_pytorch() {
        let tiers = [
            ("qwen-deepspeed", 4, 4, 2048, Zero::Z2, false, false),
            ("qwen-stage2-offload", 2, 8, 2048, Zero::Z2, true, false),
            ("qwen-stage3", 2, 8, 2048, Zero::Z3, false, false),
            ("qwen-minimal", 1, 16, 1024, Zero::Z3, true, true),
        ];
        let arch = crate::arch::preset("qwen2.5-0.5b").unwrap();
        for (name, micro, accum, seq, zero, off_opt, off_par) in tiers {
            let p = find(name).unwrap();
            let mut s = Setup::new(&arch);
            s.method = Method::Lora;
            apply(p.preset().unwrap(), &mut s, &Fixed::default());
            let got = (
                s.batch,
                s.accum,
                s.seq,
                s.zero,
                s.offload_optimizer,
                s.offload_params,
            );
            assert_eq!(got, (micro, accum, seq, zero, off_opt, off_par), "{name}");
            assert_eq!((s.precision, s.grad_ckpt), (Precision::AmpBf16, true));
            s.validate().unwrap();
            p.check_run(Task::CausalLm, Method::Lora).unwrap();
            let err = p.check_run(Task::CausalLm, Method::Full).unwrap_err();
            assert!(err.contains(name) && err.contains("--method lora"), "{err}");
            let err = p.check_run(Task::Classification, Method::Lora).unwrap_err();
            assert!(
                err.contains("causal-lm") && err.contains("classification"),
                "{err}"
            );
            let err = p.check_runtime(Runtime::Memfit).unwrap_err();
            assert!(err.contains(name) && err.contains("memfit plan"), "{err}");
        }
        let minimal = decide(find("qwen-minimal").unwrap(), 0).describe();
        assert!(
            minimal.ends_with("ZeRO-3, parameters and optimizer offloaded to CPU"),
            "{minimal}"
        );
        // the seed's tables read the machine: not presets, and memfit train's only
        let v8 = find("chatlm-v8").unwrap();
        assert!(v8.preset().is_none());
        assert!(v8.check_runtime(Runtime::Pytorch).is_err());
    }
}
