//! A training setup: every choice that changes memory, resolved (no "auto" left).

use crate::Task;
use crate::arch::{Arch, Group, Role};
use serde::{Deserialize, Serialize};

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name { $($(#[$vm])* #[serde(rename = $text)] $variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The CLI spelling.
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text),+ } }
            /// Parses the CLI spelling.
            pub fn parse(s: &str) -> Option<Self> { match s { $($text => Some($name::$variant),)+ _ => None } }
            /// All spellings, comma separated (for error messages).
            pub fn names() -> String { [$($text),+].join(", ") }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

named_enum!(
    /// Numeric format of weights and activations.
    Precision {
        /// fp32 weights and activations.
        Fp32 = "fp32",
        /// fp32 weights, fp16 autocast activations, GradScaler.
        AmpFp16 = "amp-fp16",
        /// fp32 weights, bf16 autocast activations.
        AmpBf16 = "amp-bf16",
        /// bf16 weights, gradients, optimizer states and activations.
        Bf16 = "bf16",
        /// fp16 weights (no fp32 copy).
        Fp16 = "fp16",
    }
);

named_enum!(
    Optimizer {
        AdamW = "adamw",
        /// Factored second moment, no first moment (transformers.Adafactor defaults).
        Adafactor = "adafactor",
        /// SGD with momentum.
        Sgd = "sgd",
        /// bitsandbytes blockwise 8-bit states.
        AdamW8bit = "adamw-8bit",
        /// bitsandbytes paged 8-bit states in CUDA unified memory.
        PagedAdamW8bit = "paged-adamw-8bit",
        PagedAdamW32bit = "paged-adamw-32bit",
    }
);

named_enum!(
    Method {
        Full = "full",
        Lora = "lora",
        /// LoRA on a 4-bit (or 8-bit) quantized frozen base.
        Qlora = "qlora",
        /// Some groups frozen (`--freeze`), the rest trained.
        Freeze = "freeze",
    }
);

named_enum!(
    Quant {
        Nf4 = "nf4",
        Nf4Dq = "nf4-dq",
        Int8 = "int8",
        /// GPTQ 4-bit (auto-gptq `QuantLinear`, group size 128), as transformers' `GPTQConfig`
        /// loads a GPTQ checkpoint.
        Gptq4 = "gptq4",
    }
);

named_enum!(
    /// Sharding of model states across data-parallel ranks.
    Zero {
        Z0 = "0",
        Z1 = "1",
        Z2 = "2",
        Z3 = "3",
        /// FSDP FULL_SHARD (like ZeRO-3).
        FsdpFull = "fsdp-full",
        /// FSDP SHARD_GRAD_OP (like ZeRO-2).
        FsdpGradOp = "fsdp-grad-op",
    }
);

named_enum!(
    Attention {
        /// Explicit score and probability matrices (batch × heads × seq × seq).
        Eager = "eager",
        /// torch scaled_dot_product_attention (memory-efficient / flash kernels).
        Sdpa = "sdpa",
        Flash = "flash",
    }
);

named_enum!(
    Device {
        Cuda = "cuda",
        Cpu = "cpu",
    }
);

named_enum!(
    /// Which program trains: a PyTorch/transformers process or memfit's own trainer.
    Runtime {
        Pytorch = "pytorch",
        Memfit = "memfit",
    }
);

named_enum!(
    /// How the training data is held.
    DatasetMode {
        /// The whole tokenized table in process memory (pandas/datasets in RAM).
        InMemory = "in-memory",
        /// memfit's memory-mapped token store (page cache, not RSS growth).
        TokenStore = "token-store",
        /// Re-read and tokenize each row on demand.
        Reread = "reread",
    }
);

named_enum!(
    /// The training code around the model (`memory/stack.rs` says what each keeps differently).
    #[derive(Default)]
    Stack {
        /// transformers' `Trainer` (accelerate underneath) on transformers' modeling code.
        #[default]
        HfTrainer = "hf-trainer",
        /// transformers models prepared by PEFT (`get_peft_model`, `prepare_model_for_kbit_training`).
        Peft = "peft",
        /// torchtune's recipes and model builders.
        Torchtune = "torchtune",
        /// LitGPT's `finetune` scripts on its own model code (Lightning Fabric).
        Litgpt = "litgpt",
        /// A training loop of one's own under accelerate with a DeepSpeed engine.
        AccelerateDeepspeed = "accelerate-deepspeed",
        /// PyTorch Lightning's `Trainer` on a transformers model.
        Lightning = "lightning",
    }
);

named_enum!(
    LoraTarget {
        Q = "q",
        K = "k",
        V = "v",
        O = "o",
        Qkv = "qkv",
        Gate = "gate",
        Up = "up",
        Down = "down",
        Mlp = "mlp",
        LmHead = "lm_head",
    }
);

impl Precision {
    /// Bytes of a stored weight.
    pub fn weight_bytes(self) -> u64 {
        match self {
            Precision::Bf16 | Precision::Fp16 => 2,
            _ => 4,
        }
    }
    /// Bytes of a matmul output activation.
    pub fn compute_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            _ => 2,
        }
    }
    pub fn is_amp(self) -> bool {
        matches!(self, Precision::AmpFp16 | Precision::AmpBf16)
    }
    pub fn is_half(self) -> bool {
        self != Precision::Fp32
    }
}

impl Zero {
    /// ZeRO stage equivalent (FSDP full = 3, grad-op = 2).
    pub fn stage(self) -> u8 {
        match self {
            Zero::Z0 => 0,
            Zero::Z1 => 1,
            Zero::Z2 | Zero::FsdpGradOp => 2,
            Zero::Z3 | Zero::FsdpFull => 3,
        }
    }
    pub fn is_fsdp(self) -> bool {
        matches!(self, Zero::FsdpFull | Zero::FsdpGradOp)
    }
}

impl LoraTarget {
    /// Whether this target adapts tensors of `role`.
    pub fn covers(self, role: Role) -> bool {
        match self {
            // A model whose q, k and v are one fused projection (gpt2 c_attn, bloom/falcon/gpt-neox
            // query_key_value, phi3 qkv_proj) can only adapt that projection, once: PEFT's default
            // targets for gpt2, bloom, falcon and gpt_neox are exactly it
            // (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING in peft/utils).
            LoraTarget::Q => matches!(role, Role::Q | Role::Qkv),
            LoraTarget::K => matches!(role, Role::K | Role::Qkv),
            LoraTarget::V => matches!(role, Role::V | Role::Qkv),
            LoraTarget::O => role == Role::O,
            LoraTarget::Qkv => role == Role::Qkv,
            LoraTarget::Gate => role == Role::Gate,
            LoraTarget::Up => role == Role::Up,
            LoraTarget::Down => role == Role::Down,
            LoraTarget::Mlp => matches!(role, Role::Gate | Role::Up | Role::Down),
            LoraTarget::LmHead => role == Role::LmHead,
        }
    }
}

/// Every memory-relevant choice of a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    pub task: Task,
    /// Micro-batch per GPU (samples per forward).
    pub batch: u64,
    /// Tokens per sample (the encoder length for seq2seq).
    pub seq: u64,
    /// Decoder length (seq2seq only).
    pub tgt_seq: u64,
    pub accum: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub grad_ckpt: bool,
    pub method: Method,
    pub lora_r: u64,
    pub lora_alpha: u64,
    pub lora_targets: Vec<LoraTarget>,
    pub quant: Option<Quant>,
    /// Frozen groups (`--freeze embeddings,encoder`); with `method = freeze`.
    pub freeze: Vec<FreezeGroup>,
    pub zero: Zero,
    pub offload_optimizer: bool,
    pub offload_params: bool,
    /// GPUs per node.
    pub gpus: u64,
    pub nodes: u64,
    pub attention: Attention,
    pub device: Device,
    pub runtime: Runtime,
    pub workers: u64,
    pub pin_memory: bool,
    pub dataset: DatasetMode,
    pub dataset_rows: u64,
    /// memfit's trainer: host bytes the process already holds beyond its runtime before the
    /// model is built (measured by `memfit train` after preparing its data), counted as they are.
    pub host_resident_bytes: u64,
    /// The training code (`--stack`); files written before it existed read as `hf-trainer`.
    #[serde(default)]
    pub stack: Stack,
    /// The optimizer steps inside backward, one parameter at a time (torchtune's
    /// `optimizer_in_bwd`); `None` = the stack's default (`memory/stack.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_in_backward: Option<bool>,
    /// The stack's chunked cross-entropy (torchtune's `CEWithChunkedOutputLoss`) or its plain one;
    /// `None` = the stack's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunked_loss: Option<bool>,
    /// The training loop holds the model's outputs, logits included, through backward (a loop of
    /// its own, such as Answer.AI's `train.py`); `None` = the stack's default
    /// (`Profile::outputs_freed_before_backward`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_kept: Option<bool>,
    /// memfit's own trainer under LoRA: the frozen base's dtype (`--base-precision fp32|bf16`),
    /// apart from the activations' (`precision`); `None` = fp32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_precision: Option<Precision>,
    /// Sequence lengths vary from step to step: the shortest as a fraction of the longest
    /// (`--length-spread`, in (0, 1]; 1 = every step at `seq`). `memory/allocator.rs`.
    #[serde(default = "full_length", skip_serializing_if = "is_full_length")]
    pub length_spread: f64,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`--expandable-segments`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expandable_segments: bool,
    /// DeepSpeed's `reduce_bucket_size` in elements as the run's config sets it
    /// (`--zero-bucket-size`); `None` = transformers' "auto", hidden².
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_bucket_size: Option<u64>,
    /// memfit's own trainer planned per data-parallel rank (`gpus` = 1) under `--shard-optimizer`:
    /// the ranks whose optimizer states this rank's are a share of (ZeRO-1); 1 = unsharded.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub optimizer_shards: u64,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n <= 1
}

fn full_length() -> f64 {
    1.0
}

fn is_full_length(spread: &f64) -> bool {
    *spread >= 1.0
}

named_enum!(
    FreezeGroup {
        Embeddings = "embeddings",
        Encoder = "encoder",
        Decoder = "decoder",
    }
);

impl FreezeGroup {
    pub fn group(self) -> Group {
        match self {
            FreezeGroup::Embeddings => Group::Embeddings,
            FreezeGroup::Encoder => Group::Encoder,
            FreezeGroup::Decoder => Group::Decoder,
        }
    }
}

impl Setup {
    /// The defaults of `memfit estimate` for a model: full fp32 AdamW, batch 8, seq 512, one GPU.
    pub fn new(arch: &Arch) -> Setup {
        let task = Task::default_for(arch);
        Setup {
            task,
            batch: 8,
            seq: 512,
            tgt_seq: if task == Task::Seq2seq { 128 } else { 0 },
            accum: 1,
            precision: Precision::Fp32,
            optimizer: Optimizer::AdamW,
            grad_ckpt: false,
            method: Method::Full,
            lora_r: 8,
            lora_alpha: 16,
            lora_targets: vec![LoraTarget::Q, LoraTarget::V],
            quant: None,
            freeze: Vec::new(),
            zero: Zero::Z0,
            offload_optimizer: false,
            offload_params: false,
            gpus: 1,
            nodes: 1,
            attention: Attention::Eager,
            device: Device::Cuda,
            runtime: Runtime::Pytorch,
            workers: 0,
            pin_memory: false,
            dataset: DatasetMode::InMemory,
            dataset_rows: 0,
            host_resident_bytes: 0,
            stack: Stack::HfTrainer,
            optimizer_in_backward: None,
            chunked_loss: None,
            outputs_kept: None,
            base_precision: None,
            length_spread: 1.0,
            expandable_segments: false,
            zero_bucket_size: None,
            optimizer_shards: 1,
        }
    }

    /// Data-parallel world size.
    pub fn world(&self) -> u64 {
        self.gpus.max(1) * self.nodes.max(1)
    }

    /// Samples per optimizer step over all ranks.
    pub fn effective_batch(&self) -> u64 {
        self.batch * self.accum * self.world()
    }

    /// Checks ranges and combinations; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch == 0 || self.seq == 0 || self.accum == 0 {
            return Err("--batch, --seq and --accum must be at least 1".into());
        }
        if self.task == Task::Seq2seq && self.tgt_seq == 0 {
            return Err("--tgt-seq must be at least 1 for seq2seq".into());
        }
        if self.gpus == 0 || self.nodes == 0 {
            return Err("--gpus and --nodes must be at least 1".into());
        }
        if matches!(self.method, Method::Lora | Method::Qlora) {
            if self.lora_r == 0 {
                return Err("--lora-r must be at least 1".into());
            }
            if self.lora_targets.is_empty() {
                return Err("--lora-targets must name at least one module".into());
            }
        }
        if let Some(p) = self
            .base_precision
            .filter(|p| !matches!(p, Precision::Fp32 | Precision::Bf16))
        {
            return Err(format!("--base-precision {p}: fp32 or bf16"));
        }
        if self.method == Method::Qlora && self.quant.is_none() {
            return Err("--method qlora needs --quant nf4|nf4-dq|int8|gptq4".into());
        }
        if self.method == Method::Freeze && self.freeze.is_empty() {
            return Err("--method freeze needs --freeze embeddings,encoder,…".into());
        }
        if self.device == Device::Cpu && (self.zero != Zero::Z0 || self.gpus > 1) {
            return Err("--device cpu trains in one process: --zero 0 and --gpus 1".into());
        }
        if self.runtime == Runtime::Memfit && self.precision.is_amp() {
            // burn 0.22 has no automatic mixed precision (docs/architecture.md §6)
            return Err(format!(
                "--precision {} needs autocast, which memfit's trainer does not have: use fp32 or bf16",
                self.precision
            ));
        }
        if self.offload_params && self.zero.stage() != 3 {
            return Err("--offload-params cpu needs --zero 3 (or fsdp-full)".into());
        }
        if self.offload_optimizer && self.zero.stage() == 0 {
            return Err("--offload-optimizer cpu needs --zero 1, 2 or 3".into());
        }
        Ok(())
    }
}
