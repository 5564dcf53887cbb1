//! The named policies: the seed's start-up tables (`chatlm-v*`, memfit train only), and the fixed
//! presets users hand-write as "tiers": BERT classification (`bert-*`, memfit train and the PyTorch
//! stack) and Qwen LoRA under DeepSpeed (`qwen-*`, the PyTorch stack only).

use super::{Knob, Policy, Requires, Rule, Settings};
use crate::Task;
use crate::memory::{Method, Precision, Runtime, Zero};

const GIB: u64 = 1 << 30;

/// Both trainers: memfit's own (`memfit train`) and a PyTorch process (`memfit plan`).
const BOTH: &[Runtime] = &[Runtime::Memfit, Runtime::Pytorch];

/// A fixed preset: one catch-all rule.
const fn preset(set: Settings) -> [Rule; 1] {
    [Rule {
        below_available_bytes: u64::MAX,
        set,
    }]
}

/// The BERT tiers: micro-batch × accumulation at a maximum length; bf16 mixed precision and
/// gradient checkpointing only in the lowest tier, as the users' tiers have it.
const fn bert(micro: u64, seq: u64, accum: u64, low: bool) -> Settings {
    Settings {
        micro_batch: Some(Knob::Set(micro)),
        accum: Some(Knob::Set(accum)),
        max_seq: Some(Knob::Set(seq)),
        precision: if low { Some(Precision::AmpBf16) } else { None },
        grad_ckpt: if low { Some(true) } else { None },
        workers: if low { Some(0) } else { None },
        ..Settings::NONE
    }
}

/// The Qwen LoRA tiers: bf16 mixed precision and gradient checkpointing throughout (as Qwen's
/// LoRA fine-tuning scripts run them), the ZeRO stage and offloads per tier.
const fn qwen(
    micro: u64,
    accum: u64,
    seq: u64,
    zero: Zero,
    off_opt: bool,
    off_par: bool,
) -> Settings {
    Settings {
        micro_batch: Some(Knob::Set(micro)),
        accum: Some(Knob::Set(accum)),
        max_seq: Some(Knob::Set(seq)),
        precision: Some(Precision::AmpBf16),
        grad_ckpt: Some(true),
        zero: Some(zero),
        offload_optimizer: Some(off_opt),
        offload_params: Some(off_par),
        ..Settings::NONE
    }
}

const BERT: Requires = Requires {
    task: Some(Task::Classification),
    method: None,
    runtimes: BOTH,
};

const QWEN: Requires = Requires {
    task: Some(Task::CausalLm),
    method: Some(Method::Lora),
    runtimes: &[Runtime::Pytorch],
};

const SEED: Requires = Requires {
    task: None,
    method: None,
    runtimes: &[Runtime::Memfit],
};

/// Every policy `--policy` knows, besides `auto`.
pub const POLICIES: &[Policy] = &[
    Policy {
        name: "chatlm-v8",
        source: "the seed's default start-up policy (issue 6): model/trainer_low_mem.py, 8th \
                 revision (ylan2009/ChatLM-mini-Chinese 71e3107, 2026-02-11): with less than 10 GiB \
                 available, accumulation 4, no loader workers, ultra-low-memory loading, no pinned \
                 memory; otherwise the configured values",
        requires: SEED,
        rules: &[Rule {
            below_available_bytes: 10 * GIB,
            set: Settings {
                accum: Some(Knob::Set(4)),
                workers: Some(0),
                low_memory_loading: Some(true),
                pin_memory: Some(false),
                ..Settings::NONE
            },
        }],
    },
    Policy {
        name: "chatlm-v3",
        source: "seed 000's table: model/trainer_low_mem.py, 3rd revision \
                 (ylan2009/ChatLM-mini-Chinese 5d716e6, 2026-02-09): with less than 13 GiB \
                 available, micro-batch 1 and accumulation 8, ultra-low-memory loading; otherwise \
                 micro-batch at most 2 and accumulation at least 16; never loader workers or \
                 pinned memory",
        requires: SEED,
        rules: &[
            Rule {
                below_available_bytes: 13 * GIB,
                set: Settings {
                    micro_batch: Some(Knob::Set(1)),
                    accum: Some(Knob::Set(8)),
                    workers: Some(0),
                    low_memory_loading: Some(true),
                    pin_memory: Some(false),
                    ..Settings::NONE
                },
            },
            Rule {
                below_available_bytes: u64::MAX,
                set: Settings {
                    micro_batch: Some(Knob::AtMost(2)),
                    accum: Some(Knob::AtLeast(16)),
                    workers: Some(0),
                    low_memory_loading: Some(false),
                    pin_memory: Some(false),
                    ..Settings::NONE
                },
            },
        ],
    },
    Policy {
        name: "bert-ultra-low",
        source: "the ultra-low-memory tier BERT classification users hand-write for machines with \
                 less than 8 GB RAM or a 4 GB GPU (issue 14): micro-batch 1, max length 128, \
                 accumulation 16 (effective batch 16), bf16 mixed precision, gradient \
                 checkpointing, no loader workers",
        requires: BERT,
        rules: &preset(bert(1, 128, 16, true)),
    },
    Policy {
        name: "bert-safe",
        source: "the \"safe\" tier BERT classification users hand-write (issue 14): micro-batch 4, \
                 max length 256, accumulation 4 (effective batch 16); precision and checkpointing \
                 as configured",
        requires: BERT,
        rules: &preset(bert(4, 256, 4, false)),
    },
    Policy {
        name: "bert-original",
        source: "the tier BERT classification users call the original fine-tuning recipe \
                 (issue 14): micro-batch 8 at BERT's full length of 512 tokens, accumulation 1; \
                 precision and checkpointing as configured",
        requires: BERT,
        rules: &preset(bert(8, 512, 1, false)),
    },
    Policy {
        name: "qwen-deepspeed",
        source: "a typical Qwen LoRA recipe under DeepSpeed (issue 15: transformers Trainer + PEFT, \
                 bf16, gradient checkpointing, ZeRO-2 without offload as Qwen's \
                 ds_config_zero2.json): micro-batch 4, accumulation 4 (16 rows per GPU and step), \
                 2048 tokens",
        requires: QWEN,
        rules: &preset(qwen(4, 4, 2048, Zero::Z2, false, false)),
    },
    Policy {
        name: "qwen-stage2-offload",
        source: "the Qwen LoRA recipe with ZeRO-2 and the optimizer offloaded to CPU (issue 15): \
                 micro-batch 2, accumulation 8, 2048 tokens, bf16, gradient checkpointing",
        requires: QWEN,
        rules: &preset(qwen(2, 8, 2048, Zero::Z2, true, false)),
    },
    Policy {
        name: "qwen-stage3",
        source: "the Qwen LoRA recipe with ZeRO-3, no offload (issue 15): micro-batch 2, \
                 accumulation 8, 2048 tokens, bf16, gradient checkpointing",
        requires: QWEN,
        rules: &preset(qwen(2, 8, 2048, Zero::Z3, false, false)),
    },
    Policy {
        name: "qwen-minimal",
        source: "the Qwen LoRA recipe at its leanest (issue 15): ZeRO-3 with parameters and \
                 optimizer offloaded to CPU, micro-batch 1, accumulation 16, 1024 tokens, bf16, \
                 gradient checkpointing",
        requires: QWEN,
        rules: &preset(qwen(1, 16, 1024, Zero::Z3, true, true)),
    },
];
