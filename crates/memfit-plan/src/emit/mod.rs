//! Config files for the tools that run a planned setup. Each function returns file contents; the
//! binary writes them (atomically). Keys are those the tools document, in the versions named by
//! [`TARGETS`] (checked against each tool's source at that version):
//! - DeepSpeed: docs "DeepSpeed Configuration JSON" (deepspeed/runtime/config.py, zero/config.py);
//! - accelerate: the YAML `accelerate config` writes (accelerate/commands/config/config_args.py),
//!   read back with PyYAML (YAML 1.1: a plain `NO` is the boolean false, so strings are quoted);
//! - Hugging Face `TrainingArguments` fields (transformers/training_args.py);
//! - memfit train: the TOML keys documented in docs/memory-model.md ("memfit train TOML").

use crate::arch::Arch;
use crate::memory::{Method, Optimizer, Precision, Setup, Zero};
use serde_json::{Value, json};

/// The tool versions the emitted files are written for (named in each file that allows a comment,
/// and in docs/memory-model.md). JSON files cannot carry a comment: DeepSpeed and transformers
/// read every key of theirs.
pub const TARGETS: &[(Kind, &str)] = &[
    (Kind::Deepspeed, "DeepSpeed 0.19"),
    (Kind::Accelerate, "accelerate 1.15"),
    (Kind::Hf, "transformers 5.23"),
    (Kind::Memfit, "memfit train (this build)"),
    (Kind::Profiles, "memfit run --profiles (this build)"),
];

/// The version a kind targets, as in [`TARGETS`].
pub fn target(kind: Kind) -> &'static str {
    TARGETS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or("", |(_, v)| v)
}

/// What `--emit` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deepspeed,
    Accelerate,
    Hf,
    Memfit,
    Profiles,
}

impl Kind {
    pub const NAMES: &'static str = "deepspeed, accelerate, hf, memfit, profiles";
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "deepspeed" => Some(Kind::Deepspeed),
            "accelerate" => Some(Kind::Accelerate),
            "hf" => Some(Kind::Hf),
            "memfit" => Some(Kind::Memfit),
            "profiles" => Some(Kind::Profiles),
            _ => None,
        }
    }
    /// The file each kind writes.
    pub fn file_name(self) -> &'static str {
        match self {
            Kind::Deepspeed => "deepspeed.json",
            Kind::Accelerate => "accelerate.yaml",
            Kind::Hf => "training_args.json",
            Kind::Memfit => "memfit-train.toml",
            Kind::Profiles => "profiles.toml",
        }
    }
}

/// Which FSDP an FSDP setup is written for: `fully_shard` (version 2, accelerate's and
/// transformers' default and recommendation) or the wrapper class of version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsdpVersion {
    V1,
    #[default]
    V2,
}

impl FsdpVersion {
    fn number(self) -> u8 {
        match self {
            FsdpVersion::V1 => 1,
            FsdpVersion::V2 => 2,
        }
    }
}

/// Training hyper-parameters the planner does not choose but the files need.
#[derive(Debug, Clone, PartialEq)]
pub struct Hyper {
    /// Model as the user named it (preset or config path).
    pub model: String,
    pub lr: f64,
    pub epochs: u64,
    /// 0 = run the epochs.
    pub max_steps: u64,
    /// memfit train's data and tokenizer (absolute paths), when the caller knows them; without
    /// them the memfit TOML says they are missing and `memfit train` refuses to start.
    pub data: Option<String>,
    pub valid: Option<String>,
    pub tokenizer: Option<String>,
    /// The FSDP of an FSDP setup's accelerate YAML and TrainingArguments.
    pub fsdp_version: FsdpVersion,
    /// The DeepSpeed JSON as the accelerate YAML and the TrainingArguments name it: an absolute
    /// path where the caller writes the files (accelerate and transformers resolve a relative one
    /// against the directory the user launches from, not the file's); `None`: `deepspeed.json`.
    pub deepspeed_config: Option<String>,
}

impl Hyper {
    /// How the other files name the DeepSpeed JSON.
    pub fn deepspeed_file(&self) -> &str {
        self.deepspeed_config
            .as_deref()
            .unwrap_or(Kind::Deepspeed.file_name())
    }

    /// Usual starting points: 1e-4 for full fine-tuning (T5/BERT guides), 2e-4 for LoRA (QLoRA paper).
    pub fn defaults(model: &str, setup: &Setup) -> Hyper {
        Hyper {
            model: model.to_string(),
            lr: if matches!(setup.method, Method::Lora | Method::Qlora) {
                2e-4
            } else {
                1e-4
            },
            epochs: 1,
            max_steps: 0,
            data: None,
            valid: None,
            tokenizer: None,
            fsdp_version: FsdpVersion::default(),
            deepspeed_config: None,
        }
    }
}

/// DeepSpeed config JSON.
pub fn deepspeed(arch: &Arch, setup: &Setup, hyper: &Hyper) -> Value {
    let h2 = arch.hidden * arch.hidden;
    let mut zero = json!({
        "stage": setup.zero.stage(),
        "overlap_comm": true,
        "contiguous_gradients": true,
        // the bucket the estimate planned for (`--zero-bucket-size`), else hidden² ("auto")
        "reduce_bucket_size": setup.zero_bucket_size.unwrap_or(h2),
    });
    if setup.zero.stage() == 3 {
        zero["stage3_prefetch_bucket_size"] = json!(9 * h2 / 10);
        zero["stage3_param_persistence_threshold"] = json!(10 * arch.hidden);
        zero["stage3_max_live_parameters"] = json!(1_000_000_000u64);
        zero["stage3_max_reuse_distance"] = json!(1_000_000_000u64);
        zero["stage3_gather_16bit_weights_on_model_save"] = json!(true);
    } else if setup.zero.stage() > 0 {
        zero["allgather_bucket_size"] = json!(h2);
    }
    if setup.offload_optimizer {
        zero["offload_optimizer"] = json!({"device": "cpu", "pin_memory": true});
    }
    if setup.offload_params {
        zero["offload_param"] = json!({"device": "cpu", "pin_memory": true});
    }
    let mut v = json!({
        "train_batch_size": setup.effective_batch(),
        "train_micro_batch_size_per_gpu": setup.batch,
        "gradient_accumulation_steps": setup.accum,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "bf16": {"enabled": matches!(setup.precision, Precision::AmpBf16 | Precision::Bf16)},
        "fp16": {"enabled": matches!(setup.precision, Precision::AmpFp16 | Precision::Fp16),
                 "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": 100,
        "wall_clock_breakdown": false,
    });
    // DeepSpeed builds these optimizers itself (CPU Adam when offloading); others come from the script.
    match setup.optimizer {
        Optimizer::AdamW
        | Optimizer::AdamW8bit
        | Optimizer::PagedAdamW8bit
        | Optimizer::PagedAdamW32bit => {
            v["optimizer"] = json!({"type": "AdamW", "params": {"lr": hyper.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}});
        }
        Optimizer::Sgd | Optimizer::Adafactor => {}
    }
    v
}

/// accelerate config YAML. Strings are single-quoted: accelerate reads the file with PyYAML, whose
/// YAML 1.1 resolver turns a plain `NO` (`distributed_type`) or `no` into the boolean false.
pub fn accelerate(setup: &Setup, hyper: &Hyper) -> String {
    let fsdp = hyper.fsdp_version;
    let world = setup.world();
    let distributed = if setup.zero.is_fsdp() {
        "FSDP"
    } else if setup.zero != Zero::Z0 {
        "DEEPSPEED"
    } else if world > 1 {
        "MULTI_GPU"
    } else {
        "NO"
    };
    let mixed = match setup.precision {
        Precision::AmpBf16 | Precision::Bf16 => "bf16",
        Precision::AmpFp16 | Precision::Fp16 => "fp16",
        Precision::Fp32 => "no",
    };
    let mut y = format!(
        "# accelerate launch --config_file FILE; written by memfit plan for {}\n",
        target(Kind::Accelerate)
    );
    y += "compute_environment: 'LOCAL_MACHINE'\n";
    y += &format!("distributed_type: '{distributed}'\n");
    if distributed == "DEEPSPEED" {
        y += "deepspeed_config:\n";
        // YAML's single-quoted string: a quote inside is written twice
        let file = hyper.deepspeed_file().replace('\'', "''");
        y += &format!("  deepspeed_config_file: '{file}'\n");
        y += &format!("  zero3_init_flag: {}\n", setup.zero.stage() == 3);
    } else {
        // under FSDP the top-level precision is its MixedPrecision policy (ACCELERATE_MIXED_PRECISION)
        y += &format!("mixed_precision: '{mixed}'\n");
    }
    if distributed == "FSDP" {
        y += &fsdp_yaml(setup, fsdp);
    }
    y += "machine_rank: 0\n";
    y += "main_training_function: 'main'\n";
    y += &format!("num_machines: {}\n", setup.nodes);
    y += &format!("num_processes: {world}\n");
    y += "rdzv_backend: 'static'\n";
    y += "same_network: true\n";
    y += &format!("use_cpu: {}\n", setup.device == crate::memory::Device::Cpu);
    y
}

/// The `fsdp_config` block, with the keys `accelerate config` writes for the version
/// (accelerate/commands/config/cluster.py). Version 2 (`fully_shard`) says the sharding with
/// `fsdp_reshard_after_forward` as a bool (true = FULL_SHARD, false = SHARD_GRAD_OP), where version
/// 1 takes the strategy's name under the same key and, deprecated but the one its plugin reads
/// under `accelerate launch` (checked with accelerate 1.15), `fsdp_sharding_strategy`; version 2 has no `fsdp_backward_prefetch`, `fsdp_forward_prefetch`,
/// `fsdp_use_orig_params` or `fsdp_sync_module_states` (FullyShardedDataParallelPlugin refuses them).
fn fsdp_yaml(setup: &Setup, fsdp: FsdpVersion) -> String {
    let full = setup.zero == Zero::FsdpFull;
    let mut y = "fsdp_config:\n".to_string();
    y += &format!("  fsdp_version: {}\n", fsdp.number());
    match fsdp {
        FsdpVersion::V2 => y += &format!("  fsdp_reshard_after_forward: {full}\n"),
        FsdpVersion::V1 => {
            let strategy = if full { "FULL_SHARD" } else { "SHARD_GRAD_OP" };
            y += &format!("  fsdp_reshard_after_forward: '{strategy}'\n");
            // what the version-1 plugin reads through `accelerate launch`: FSDP_SHARDING_STRATEGY,
            // whose launch default FULL_SHARD would otherwise override the key above
            y += &format!("  fsdp_sharding_strategy: '{strategy}'\n");
            y += "  fsdp_backward_prefetch: 'BACKWARD_PRE'\n";
            y += "  fsdp_forward_prefetch: false\n";
            y += "  fsdp_use_orig_params: true\n";
            y += "  fsdp_sync_module_states: true\n";
        }
    }
    y += "  fsdp_auto_wrap_policy: 'TRANSFORMER_BASED_WRAP'\n";
    // FSDP's CPU offload moves parameters and gradients and steps the optimizer on the host: the
    // planner's parameter + optimizer offload
    y += &format!("  fsdp_offload_params: {}\n", setup.offload_params);
    y += "  fsdp_state_dict_type: 'SHARDED_STATE_DICT'\n";
    y += "  fsdp_cpu_ram_efficient_loading: false\n";
    // Under FSDP, checkpointing is FSDP's: transformers refuses `gradient_checkpointing`
    // together with it (Trainer.create_accelerator_and_postprocess), see hf_training_args.
    y += &format!("  fsdp_activation_checkpointing: {}\n", setup.grad_ckpt);
    y
}

/// Hugging Face TrainingArguments as JSON (`TrainingArguments(**json.load(f))`). transformers 5
/// still names checkpointing `gradient_checkpointing` (`activation_checkpointing` is a key of FSDP's
/// config, which the accelerate YAML sets instead under FSDP: the Trainer refuses both at once).
pub fn hf_training_args(setup: &Setup, hyper: &Hyper) -> Value {
    let optim = match setup.optimizer {
        Optimizer::AdamW => "adamw_torch",
        Optimizer::Adafactor => "adafactor",
        Optimizer::Sgd => "sgd",
        Optimizer::AdamW8bit => "adamw_bnb_8bit",
        Optimizer::PagedAdamW8bit => "paged_adamw_8bit",
        Optimizer::PagedAdamW32bit => "paged_adamw_32bit",
    };
    let mut v = json!({
        "output_dir": "out",
        "per_device_train_batch_size": setup.batch,
        "gradient_accumulation_steps": setup.accum,
        "gradient_checkpointing": setup.grad_ckpt && !setup.zero.is_fsdp(),
        "bf16": matches!(setup.precision, Precision::AmpBf16 | Precision::Bf16),
        "fp16": matches!(setup.precision, Precision::AmpFp16 | Precision::Fp16),
        "optim": optim,
        "learning_rate": hyper.lr,
        "num_train_epochs": hyper.epochs as f64,
        "max_steps": if hyper.max_steps == 0 { -1 } else { hyper.max_steps as i64 },
        "max_grad_norm": 1.0,
        "dataloader_num_workers": setup.workers,
        "dataloader_pin_memory": setup.pin_memory,
        "use_cpu": setup.device == crate::memory::Device::Cpu,
        "save_strategy": "steps",
        "logging_steps": 10,
    });
    if setup.zero != Zero::Z0 && !setup.zero.is_fsdp() {
        v["deepspeed"] = json!(hyper.deepspeed_file());
    }
    if setup.zero.is_fsdp() {
        // the same FSDP as the accelerate YAML, so the Trainer builds it under plain torchrun too
        // (TrainingArguments._process_fsdp_args: `fsdp: true` and every setting in `fsdp_config`,
        // keys without the `fsdp_` prefix; a strategy string in `fsdp` is deprecated)
        let full = setup.zero == Zero::FsdpFull;
        v["fsdp"] = json!(true);
        v["fsdp_config"] = json!({
            "version": hyper.fsdp_version.number(),
            "reshard_after_forward": match hyper.fsdp_version {
                FsdpVersion::V2 => json!(full),
                FsdpVersion::V1 => json!(if full { "full_shard" } else { "shard_grad_op" }),
            },
            "cpu_offload": setup.offload_params,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "activation_checkpointing": setup.grad_ckpt,
        });
    }
    v
}

/// The precision memfit train runs for a planned one: fp32, or bf16 (memfit's bf16 is mixed: f32
/// master weights, bf16 activations — what amp-bf16 is; fp16 has no kernel here and the same bytes
/// as bf16).
fn memfit_precision(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        _ => "bf16",
    }
}

/// memfit train TOML: model, task, [data, valid, tokenizer], batch, accum, seq, tgt_seq, precision,
/// optimizer, grad_ckpt, lr, epochs, max_steps. Without data the file says so in a comment, and
/// `memfit train` refuses it, naming the file.
pub fn memfit_train(setup: &Setup, hyper: &Hyper) -> String {
    let mut t = toml::Table::new();
    t.insert("model".into(), hyper.model.clone().into());
    let task = serde_json::to_value(setup.task)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    t.insert("task".into(), task.into());
    if setup.method != Method::Full {
        // a trainer that does not know the key must not train every weight instead: memfit train
        // warns about keys it ignores, and `memfit check` refuses a config with one
        t.insert("method".into(), setup.method.as_str().into());
    }
    for (key, value) in [
        ("data", &hyper.data),
        ("valid", &hyper.valid),
        ("tokenizer", &hyper.tokenizer),
    ] {
        if let Some(v) = value {
            t.insert(key.into(), v.clone().into());
        }
    }
    t.insert("batch".into(), (setup.batch as i64).into());
    t.insert("accum".into(), (setup.accum as i64).into());
    t.insert("seq".into(), (setup.seq as i64).into());
    t.insert("tgt_seq".into(), (setup.tgt_seq as i64).into());
    t.insert("precision".into(), memfit_precision(setup.precision).into());
    t.insert("optimizer".into(), setup.optimizer.as_str().into());
    t.insert("grad_ckpt".into(), setup.grad_ckpt.into());
    t.insert("lr".into(), hyper.lr.into());
    t.insert("epochs".into(), (hyper.epochs as i64).into());
    t.insert("max_steps".into(), (hyper.max_steps as i64).into());
    let mut text = format!(
        "# written by memfit plan for {}: memfit train --config FILE (keys: docs/memory-model.md)\n",
        target(Kind::Memfit)
    );
    if hyper.data.is_none() {
        text += "# No training data named: set `data` (parquet/JSONL file or token store) and\n";
        text +=
            "# `tokenizer` (tokenizer.json or its directory) here, or pass --data/--tokenizer.\n";
    }
    text + &toml::to_string(&t).unwrap_or_default()
}

/// Lower-memory variants of a setup for `memfit run --profiles`, leanest last: each overrides
/// --batch/--accum/--grad-ckpt and keeps the effective batch.
pub fn profile_setups(setup: &Setup) -> Vec<(String, Setup)> {
    let mut out = Vec::new();
    let per_rank = setup.batch * setup.accum;
    let mut push = |name: String, batch: u64, ckpt: bool| {
        let mut s = setup.clone();
        s.batch = batch.max(1);
        s.accum = per_rank / s.batch;
        s.grad_ckpt = ckpt;
        if !out
            .iter()
            .any(|(_, o): &(String, Setup)| o.batch == s.batch && o.grad_ckpt == s.grad_ckpt)
            && (s.batch, s.grad_ckpt) != (setup.batch, setup.grad_ckpt)
        {
            out.push((name, s));
        }
    };
    let half = setup.batch / 2;
    if half >= 1 && per_rank.is_multiple_of(half) {
        push(format!("half-batch-{half}"), half, setup.grad_ckpt);
    }
    push(
        format!("grad-ckpt-batch-{}", setup.batch),
        setup.batch,
        true,
    );
    if half >= 1 && per_rank.is_multiple_of(half) {
        push(format!("grad-ckpt-half-batch-{half}"), half, true);
    }
    push("grad-ckpt-batch-1".to_string(), 1, true);
    out
}

/// The profiles TOML: `[[profile]] name = …, args = [...], env = {…}`.
pub fn profiles(setup: &Setup) -> String {
    let mut list = Vec::new();
    for (name, s) in profile_setups(setup) {
        let mut p = toml::Table::new();
        p.insert("name".into(), name.into());
        let mut args = vec![
            "--batch".to_string(),
            s.batch.to_string(),
            "--accum".to_string(),
            s.accum.to_string(),
        ];
        if s.grad_ckpt {
            args.push("--grad-ckpt".to_string());
        }
        p.insert(
            "args".into(),
            toml::Value::Array(args.into_iter().map(Into::into).collect()),
        );
        let mut env = toml::Table::new();
        if s.device == crate::memory::Device::Cuda {
            // lets the caching allocator grow segments instead of stranding split blocks
            // (PyTorch CUDA semantics docs, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF")
            env.insert(
                "PYTORCH_CUDA_ALLOC_CONF".into(),
                "expandable_segments:True".into(),
            );
        }
        p.insert("env".into(), toml::Value::Table(env));
        list.push(toml::Value::Table(p));
    }
    let mut root = toml::Table::new();
    root.insert("profile".into(), toml::Value::Array(list));
    format!("# written by memfit plan for {}\n", target(Kind::Profiles))
        + &toml::to_string(&root).unwrap_or_default()
}

/// Renders the requested kinds: (file name, contents).
pub fn render(
    kinds: &[Kind],
    arch: &Arch,
    setup: &Setup,
    hyper: &Hyper,
) -> Vec<(&'static str, String)> {
    kinds
        .iter()
        .map(|k| {
            let text = match k {
                Kind::Deepspeed => pretty(&deepspeed(arch, setup, hyper)),
                Kind::Accelerate => accelerate(setup, hyper),
                Kind::Hf => pretty(&hf_training_args(setup, hyper)),
                Kind::Memfit => memfit_train(setup, hyper),
                Kind::Profiles => profiles(setup),
            };
            (k.file_name(), text)
        })
        .collect()
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}
