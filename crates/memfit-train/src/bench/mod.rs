//! `memfit bench train` (and `bench matmul`, [`matmul`]): trains a model on seeded synthetic tokens for a fixed number of steps and
//! reports the median step time, tokens/s and peak RSS (docs/architecture.md §3), counted as the PyTorch
//! baselines in `../shared/bench/pytorch/` count them (`bench_t5.py`: batch × (source + target)
//! tokens; `bench_bert_cls.py`: batch × sequence), so the two can be compared side by side.

pub mod matmul;

use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::TaskKind;
use crate::device::ChosenDevice;
use crate::engine::{
    CausalLmBatch, ClassificationBatch, Engine, EngineOptions, ModelEngine, Precision,
    Seq2SeqBatch, TokenRows, set_threads,
};
use crate::optim::{AdafactorConfig, AdafactorLr, AdamWConfig, OptimizerConfig};
use memfit_nn::ModelError;
use memfit_nn::families::{self, Training};
use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::model::TrainModel;
use memfit_plan::grid;

/// Steps excluded from the median, as the baselines' `WARMUP`.
pub const WARMUP_STEPS: usize = 3;

/// Clipping of the baselines' runs (clip 1.0; AdamW weight decay 0.01).
const MAX_GRAD_NORM: f64 = 1.0;

/// The first word id of the baselines' vocabularies (`benchcommon.T5_FIRST_WORD`: after pad, eos,
/// unk; `BERT_FIRST_WORD`: after pad, unk, [CLS], [SEP]).
const T5_FIRST_WORD: u32 = 3;
const BERT_FIRST_WORD: u32 = 4;
/// `benchcommon.BERT_CLS` / `BERT_SEP`.
const BERT_CLS: u32 = 2;
const BERT_SEP: u32 = 3;
/// `bench_bert_cls.py --labels` default.
const BERT_LABELS: usize = 2;

#[derive(Debug, Clone)]
pub struct BenchSetup {
    /// Name shown in the report (preset name or config path).
    pub model_name: String,
    /// The model's config.json.
    pub model_config: Value,
    pub batch: usize,
    /// Source (seq2seq) or text (classification) tokens per row.
    pub src_len: usize,
    /// Target tokens per row (seq2seq).
    pub tgt_len: usize,
    pub accum: usize,
    pub steps: usize,
    pub threads: usize,
    pub grad_ckpt: bool,
    pub precision: Precision,
    /// `adamw` or `adafactor` (external lr, no parameter scaling, as bench_t5.py's `--optim adafactor`).
    pub optimizer: String,
    /// Frozen module groups (no gradients, no optimizer state), in the family's names.
    pub freeze: Vec<String>,
    pub seed: u64,
    /// Causal LM: full training or LoRA (with its base's precision), as bench_causal_lora.py.
    pub training: Training,
    /// Causal LM: the share of each row that is prompt (masked out of the loss).
    pub prompt_frac: f64,
    /// What it computes on (`--device`).
    pub device: ChosenDevice,
}

impl BenchSetup {
    /// The run as `memfit train` would be configured for it (what the planner reads).
    pub fn train_config(&self) -> Result<crate::config::TrainConfig, ModelError> {
        use crate::config::{Method, OptimizerKind, Precision as ConfigPrecision, TrainConfig};
        let mut c = TrainConfig {
            model: self.model_name.clone(),
            task: self.task()?,
            batch: self.batch,
            seq: self.src_len,
            tgt_seq: self.tgt_len,
            accum: self.accum,
            grad_ckpt: self.grad_ckpt,
            precision: match self.precision {
                Precision::Bf16 => ConfigPrecision::Bf16,
                Precision::Fp32 => ConfigPrecision::Fp32,
            },
            optimizer: match self.optimizer.as_str() {
                "adafactor" => OptimizerKind::Adafactor,
                _ => OptimizerKind::Adamw,
            },
            freeze: self.freeze.clone(),
            ..TrainConfig::default()
        };
        if let Training::Lora {
            settings,
            targets,
            base_bf16,
        } = &self.training
        {
            c.method = Method::Lora;
            c.lora_r = Some(settings.r);
            c.lora_alpha = Some(settings.alpha);
            c.lora_targets = Some(targets.clone());
            c.base_precision = Some(if *base_bf16 {
                ConfigPrecision::Bf16
            } else {
                ConfigPrecision::Fp32
            });
        }
        Ok(c)
    }

    /// The task the model trains for.
    pub fn task(&self) -> Result<TaskKind, ModelError> {
        match families::task_of(&self.model_config) {
            Some("seq2seq") => Ok(TaskKind::Seq2seq),
            Some("classification") => Ok(TaskKind::Classification),
            Some("causal-lm") => Ok(TaskKind::CausalLm),
            _ => Err(ModelError::Config(format!(
                "model {}: model_type {:?} is not one memfit bench train runs (t5, bert, roberta, \
                 llama, qwen2, mistral, qwen3)",
                self.model_name,
                families::model_type(&self.model_config)
            ))),
        }
    }

    /// The baselines' learning rates: 1e-3 for T5 (`bench_t5.py`), 1e-4 for BERT
    /// (`bench_bert_cls.py`), 2e-4 for a causal LM (`bench_causal_lora.py`).
    fn lr(&self) -> f64 {
        match self.task() {
            Ok(TaskKind::Classification) => 1e-4,
            Ok(TaskKind::CausalLm) => 2e-4,
            _ => 1e-3,
        }
    }

    /// AdamW's weight decay: bench_causal_lora.py's 0, the others' 0.01.
    fn weight_decay(&self) -> f64 {
        match self.task() {
            Ok(TaskKind::CausalLm) => 0.0,
            _ => 0.01,
        }
    }

    /// Tokens of one optimizer step, as the baselines count them.
    fn tokens_per_step(&self) -> f64 {
        let per_row = match self.task() {
            Ok(TaskKind::Classification | TaskKind::CausalLm) => self.src_len,
            _ => self.src_len + self.tgt_len,
        };
        (self.batch * self.accum * per_row) as f64
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub sec_per_step_median: f64,
    /// Median CPU time (user + system, all threads) per step: the figure to compare on a busy machine.
    pub cpu_sec_per_step_median: f64,
    pub tokens_per_s: f64,
    pub peak_rss_bytes: u64,
    pub loss_first: f64,
    pub loss_last: f64,
    pub steps: usize,
    pub warmup_steps: usize,
    pub threads: usize,
    pub setup: Value,
    /// Every step's wall time, seconds.
    pub step_seconds: Vec<f64>,
    /// Every step's mean loss (what device parity compares).
    pub losses: Vec<f64>,
    /// The device (`cpu`, `cuda:0`) and the training state's placement.
    pub device: String,
    pub placement: String,
    /// burn's memory pool on a GPU after the last step: bytes in use and reserved (`None` on the
    /// CPU).
    pub gpu_pool_in_use_bytes: Option<u64>,
    pub gpu_pool_reserved_bytes: Option<u64>,
    /// The pool's reserved bytes at their highest over the steps (read after each, outside its
    /// timing): beside NVML's peak, it tells pages the pool gave back before the end from memory
    /// the pool never counts (docs/gpu.md, the NVML gap).
    pub gpu_pool_reserved_peak_bytes: Option<u64>,
    pub params_total: u64,
    /// The planner's model of this run on a GPU (`memfit_device`): its peak allocated bytes and
    /// what NVML would show; `None` where the model does not cover the family.
    pub predicted_gpu_allocated_bytes: Option<u64>,
    pub predicted_gpu_nvml_bytes: Option<u64>,
    /// Model FLOPs of one optimizer step (forward + backward matmuls; no recomputation).
    pub model_flops_per_step: f64,
    /// One core's peak FLOP/s for the run's products, measured on the core ([`crate::peak_flops`]):
    /// f32 FMA, or for bf16 the AVX512-BF16 dot product where the CPU has it.
    pub cpu_peak_flops_per_core: Option<f64>,
    /// How that peak was measured (instruction set and operation).
    pub cpu_peak_basis: String,
    /// Model FLOPs utilisation per CPU-second: model FLOPs ÷ (CPU-seconds × one core's peak). It
    /// equals the usual wall-clock MFU when every thread is busy, and stays comparable on a
    /// machine others are loading. `None` (with the peak) on a GPU.
    pub mfu: Option<f64>,
}

/// A model spec on the command line: `tiny` (issue 6's configuration a: a T5 of vocab 8000,
/// d_model 256, d_ff 1024, 4+4 layers, 4 heads), `bert-small` (`bench_bert_cls.py`'s small shape:
/// vocab 21128, hidden 256, 4 layers, 4 heads), `qwen2-small` (a 39M Qwen2-shaped decoder), a
/// planner preset (t5-small, chatlm-mini,
/// bert-base-chinese, …) or a config.json path.
pub fn resolve_model(spec: &str) -> Result<Value, ModelError> {
    match spec {
        "tiny" => return Ok(tiny_config_json()),
        "bert-small" => return Ok(bert_config_json(256, 4, 4)),
        "qwen2-small" => return Ok(qwen2_small_config_json()),
        _ => {}
    }
    // A planner preset unless a file of that name exists.
    let path = std::path::Path::new(spec);
    match memfit_plan::arch::preset_config_json(spec) {
        Some(config) if !path.exists() => Ok(config),
        _ => {
            let file = if path.is_dir() {
                path.join("config.json")
            } else {
                path.to_path_buf()
            };
            let text = std::fs::read_to_string(&file).map_err(|e| {
                ModelError::Input(format!(
                    "{spec:?}: not tiny, bert-small, a preset or a readable config.json ({e})"
                ))
            })?;
            serde_json::from_str(&text)
                .map_err(|e| ModelError::Config(format!("{}: {e}", file.display())))
        }
    }
}

/// The dropout fields of the families' configs (T5; BERT's two; a decoder's attention).
const DROPOUT_FIELDS: [&str; 4] = [
    "dropout_rate",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "attention_dropout",
];

/// The largest dropout probability among `config`'s dropout fields (0 where it has none).
pub fn dropout_of(config: &Value) -> f64 {
    DROPOUT_FIELDS
        .iter()
        .filter_map(|name| config.get(*name).and_then(Value::as_f64))
        .fold(0.0, f64::max)
}

/// Sets every dropout field `config` has to `p` (`bench train --dropout`: 0 compares devices on
/// backends that draw their own masks); an error where it has none.
pub fn set_dropout(config: &mut Value, p: f64) -> Result<(), ModelError> {
    if !(0.0..1.0).contains(&p) {
        return Err(ModelError::Input(format!("dropout {p}: must be in [0, 1)")));
    }
    let fields = config
        .as_object_mut()
        .ok_or_else(|| ModelError::Config("the model config is not a JSON object".into()))?;
    let mut found = false;
    for name in DROPOUT_FIELDS {
        if let Some(value) = fields.get_mut(name) {
            *value = json!(p);
            found = true;
        }
    }
    if found {
        Ok(())
    } else {
        Err(ModelError::Config(format!(
            "the model config has none of the dropout fields {DROPOUT_FIELDS:?}"
        )))
    }
}

/// Issue 6 configuration (a), shaped as bench_t5.py builds it (d_kv = d_model / heads).
pub fn tiny_config_json() -> Value {
    json!({
        "model_type": "t5", "vocab_size": 8000, "d_model": 256, "d_kv": 64, "d_ff": 1024,
        "num_layers": 4, "num_decoder_layers": 4, "num_heads": 4, "feed_forward_proj": "relu",
        "dropout_rate": 0.1, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    })
}

/// A small Qwen2-shaped decoder for the memory grid: vocab 32000, hidden 512, intermediate 1408,
/// 8 layers, 8 query and 2 key/value heads of 64, tied embeddings (39M parameters).
pub fn qwen2_small_config_json() -> Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 32000,
        "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": true, "attention_dropout": 0.0
    })
}

/// A BERT as `bench_bert_cls.py` builds it: vocab 21128, intermediate 4 × hidden, 512 positions,
/// dropout 0.1, 2 labels, pad id 0.
pub fn bert_config_json(hidden: usize, layers: usize, heads: usize) -> Value {
    json!({
        "model_type": "bert", "vocab_size": 21128, "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": 4 * hidden, "max_position_embeddings": 512,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "num_labels": BERT_LABELS, "pad_token_id": 0
    })
}

fn optimizer_config(name: &str, weight_decay: f64) -> Result<OptimizerConfig, ModelError> {
    match name {
        "adamw" => Ok(OptimizerConfig::AdamW(AdamWConfig {
            weight_decay,
            ..AdamWConfig::default()
        })),
        "adafactor" => Ok(OptimizerConfig::Adafactor(AdafactorConfig {
            lr: AdafactorLr::External,
            scale_parameter: false,
            ..Default::default()
        })),
        other => Err(ModelError::Input(format!(
            "--optimizer {other:?}: expected adamw or adafactor"
        ))),
    }
}

/// Peak resident set size of this process (VmHWM in /proc/self/status), 0 where unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// CPU time of this process (user + system, all threads) from /proc/self/stat, seconds.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th of those.
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // USER_HZ: /proc reports clock ticks of 1/100 s on Linux (proc(5)).
    (ticks(11) + ticks(12)) / 100.0
}

/// `rows` rows of `len` random words in `[first, vocab)` (`--data random` of the baselines).
fn random_rows(
    rng: &mut SplitMix64,
    vocab: usize,
    first: u32,
    rows: usize,
    len: usize,
) -> Vec<u32> {
    let span = (vocab as u64).saturating_sub(u64::from(first)).max(1);
    (0..rows * len)
        .map(|_| first + (rng.next_u64() % span) as u32)
        .collect()
}

/// A seq2seq batch as bench_t5.py `--data random` makes one: every row ends in EOS, no padding.
fn seq2seq_batch(
    rng: &mut SplitMix64,
    config: &Value,
    b: usize,
    src: usize,
    tgt: usize,
) -> Seq2SeqBatch {
    let vocab = config["vocab_size"].as_u64().unwrap_or(32128) as usize;
    let eos = config["eos_token_id"].as_u64().unwrap_or(1) as u32;
    let mut ends_in_eos = |len: usize| {
        let mut ids = random_rows(rng, vocab, T5_FIRST_WORD, b, len);
        ids.chunks_mut(len).for_each(|row| row[len - 1] = eos);
        ids
    };
    let (source, labels) = (ends_in_eos(src), ends_in_eos(tgt));
    Seq2SeqBatch {
        source: TokenRows {
            batch: b,
            len: src,
            mask: vec![true; source.len()],
            ids: source,
        },
        label_mask: vec![true; labels.len()],
        labels,
        tgt_len: tgt,
    }
}

/// A causal-LM batch as bench_causal_lora.py makes one: random ids in `[1, vocab)`, rows full
/// length, the first `prompt` tokens of each masked out of the loss.
fn causal_batch(
    rng: &mut SplitMix64,
    config: &Value,
    b: usize,
    len: usize,
    prompt: usize,
) -> CausalLmBatch {
    let vocab = config["vocab_size"].as_u64().unwrap_or(151_936) as usize;
    let ids = random_rows(rng, vocab, 1, b, len);
    CausalLmBatch {
        input: TokenRows {
            batch: b,
            len,
            mask: vec![true; ids.len()],
            ids,
        },
        target_mask: (0..b * len).map(|i| i % len >= prompt.max(1)).collect(),
    }
}

/// A classification batch as bench_bert_cls.py `--data random` makes one: `[CLS] words [SEP]`, no
/// padding, token types 0, random labels.
fn classification_batch(
    rng: &mut SplitMix64,
    config: &Value,
    b: usize,
    len: usize,
) -> ClassificationBatch {
    let vocab = config["vocab_size"].as_u64().unwrap_or(21128) as usize;
    let mut ids = random_rows(rng, vocab, BERT_FIRST_WORD, b, len);
    ids.chunks_mut(len).for_each(|row| {
        row[0] = BERT_CLS;
        row[len - 1] = BERT_SEP;
    });
    ClassificationBatch {
        input: TokenRows {
            batch: b,
            len,
            mask: vec![true; ids.len()],
            ids,
        },
        token_types: Some(vec![0; b * len]),
        labels: (0..b)
            .map(|_| (rng.next_u64() % BERT_LABELS as u64) as u32)
            .collect(),
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the benchmark; `on_step(step, loss, seconds)` is called after every optimizer step.
pub fn run(
    setup: &BenchSetup,
    on_step: impl FnMut(usize, f64, f64),
) -> Result<BenchReport, ModelError> {
    if setup.steps <= WARMUP_STEPS {
        return Err(ModelError::Input(format!(
            "--steps {}: must be more than the {WARMUP_STEPS} warm-up steps",
            setup.steps
        )));
    }
    let task = setup.task()?;
    let needs_tgt = task == TaskKind::Seq2seq;
    if setup.batch == 0
        || setup.src_len < 2
        || (needs_tgt && setup.tgt_len == 0)
        || setup.accum == 0
        || setup.threads == 0
    {
        return Err(ModelError::Input(
            "--batch, --tgt-seq, --accum and --threads must be > 0, --seq at least 2".into(),
        ));
    }
    set_threads(setup.threads)?;
    let options = EngineOptions {
        optimizer: optimizer_config(&setup.optimizer, setup.weight_decay())?,
        precision: setup.precision,
        grad_ckpt: setup.grad_ckpt,
        freeze: setup.freeze.clone(),
        backend: setup.device.backend,
        placement: setup.device.placement,
    };
    let (config, name) = (&setup.model_config, setup.model_name.as_str());
    let (b, src, tgt) = (setup.batch, setup.src_len, setup.tgt_len);
    match task {
        TaskKind::CausalLm => {
            let (model, _) = families::causal_lm(
                config,
                name,
                None,
                &setup.training,
                (setup.seed, setup.device.backend.device()),
            )?;
            let engine = ModelEngine::new(model, options)?;
            let prompt = (setup.src_len as f64 * setup.prompt_frac) as usize;
            run_steps(engine, setup, on_step, |rng| {
                causal_batch(rng, config, b, src, prompt)
            })
        }
        TaskKind::Classification => {
            let labels: Vec<String> = (0..BERT_LABELS).map(|i| format!("LABEL_{i}")).collect();
            let (model, _) = families::classifier(config, name, &labels, None, setup.seed)?;
            let engine = ModelEngine::new(model, options)?;
            run_steps(engine, setup, on_step, |rng| {
                classification_batch(rng, config, b, src)
            })
        }
        _ => {
            let (model, _) = families::seq2seq(config, name, None, setup.seed)?;
            let engine = ModelEngine::new(model, options)?;
            run_steps(engine, setup, on_step, |rng| {
                seq2seq_batch(rng, config, b, src, tgt)
            })
        }
    }
}

/// The timed steps of [`run`], on an engine and its synthetic batches.
fn run_steps<M: TrainModel>(
    mut engine: ModelEngine<M>,
    setup: &BenchSetup,
    mut on_step: impl FnMut(usize, f64, f64),
    mut make_batch: impl FnMut(&mut SplitMix64) -> M::Batch,
) -> Result<BenchReport, ModelError> {
    let mut rng = SplitMix64::new(setup.seed ^ 0xDA7A);
    let (mut seconds, mut cpu, mut losses) = (Vec::new(), Vec::new(), Vec::new());
    let mut micro = 0u64;
    let mut model_flops = 0.0;
    // The core's peak, measured before and after the steps, the better kept: one measurement
    // can fall in a moment the VM's core is lent elsewhere. Not on a GPU: a CPU core's peak says
    // nothing of that run (scripts/gpu/tables.py sets the card's data-sheet peak beside it).
    let bf16_peak = setup.precision == Precision::Bf16;
    let before =
        (!setup.device.is_gpu()).then(|| crate::peak_flops::peak_flops_per_core(bf16_peak));
    let trainable = engine.model().trainable(&setup.freeze)?;
    let pool_usage = || {
        (setup.device.is_gpu())
            .then(|| setup.device.backend.device().memory_pool_usage())
            .flatten()
    };
    let mut reserved_peak: Option<u64> = None;
    for step in 0..setup.steps {
        let batches: Vec<M::Batch> = (0..setup.accum).map(|_| make_batch(&mut rng)).collect();
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let mut loss = 0.0;
        for b in &batches {
            micro += 1;
            let scale = 1.0 / setup.accum as f32;
            loss += f64::from(engine.accumulate(b, scale, setup.seed.wrapping_add(micro))?);
        }
        engine.step(setup.lr(), Some(MAX_GRAD_NORM))?;
        let dt = t0.elapsed().as_secs_f64();
        cpu.push(cpu_seconds() - c0);
        seconds.push(dt);
        losses.push(loss / setup.accum as f64);
        on_step(step, loss / setup.accum as f64, dt);
        reserved_peak = reserved_peak.max(pool_usage().map(|p| p.bytes_reserved));
        if step == 0 {
            model_flops = batches
                .iter()
                .map(|b| engine.model().training_flops(b, &trainable))
                .sum();
        }
    }
    let sec = median(&seconds[WARMUP_STEPS..]);
    let cpu_sec = median(&cpu[WARMUP_STEPS..]);
    let pool = pool_usage();
    let predicted =
        crate::plan_file::gpu_estimate(&setup.train_config()?, &setup.model_config).ok();
    let peak = before.map(|(peak_before, _)| {
        crate::peak_flops::peak_flops_per_core(bf16_peak)
            .0
            .max(peak_before)
    });
    Ok(BenchReport {
        sec_per_step_median: sec,
        cpu_sec_per_step_median: cpu_sec,
        tokens_per_s: setup.tokens_per_step() / sec,
        peak_rss_bytes: peak_rss_bytes(),
        loss_first: losses[0],
        loss_last: *losses.last().unwrap_or(&f64::NAN),
        steps: setup.steps,
        warmup_steps: WARMUP_STEPS,
        threads: setup.threads,
        setup: json!({
            "model": setup.model_name, "task": setup.task()?.name(), "batch": setup.batch,
            "seq": setup.src_len, "tgt_seq": setup.tgt_len, "accum": setup.accum,
            "grad_ckpt": setup.grad_ckpt, "precision": setup.precision.name(),
            "optimizer": setup.optimizer, "lr": setup.lr(), "max_grad_norm": MAX_GRAD_NORM,
            "seed": setup.seed, "backend": format!("{:?}", setup.device.backend),
            "freeze": setup.freeze, "dropout": dropout_of(&setup.model_config),
            "training": format!("{:?}", setup.training),
        }),
        params_total: engine.param_counts().total,
        step_seconds: seconds,
        device: setup.device.label.clone(),
        placement: setup.device.placement.name().into(),
        gpu_pool_in_use_bytes: pool.as_ref().map(|p| p.bytes_in_use),
        gpu_pool_reserved_bytes: pool.as_ref().map(|p| p.bytes_reserved),
        gpu_pool_reserved_peak_bytes: reserved_peak,
        predicted_gpu_allocated_bytes: predicted.as_ref().map(|g| g.peak_allocated_bytes),
        predicted_gpu_nvml_bytes: predicted.as_ref().map(|g| g.nvml_used_bytes),
        losses,
        model_flops_per_step: model_flops,
        cpu_peak_flops_per_core: peak,
        cpu_peak_basis: before
            .map_or("none: the run is on a GPU", |(_, basis)| basis)
            .into(),
        mfu: peak
            .filter(|_| cpu_sec > 0.0)
            .map(|p| model_flops / (cpu_sec * p)),
    })
}

/// Measures one point of the memory grid ([`memfit_plan::grid::POINTS`]) in its own process:
/// `exe bench train … --json` (exe is the memfit binary), so every peak RSS starts from a fresh
/// process. Returns the row of `validation/memfit_grid.csv`.
pub fn measure_grid_point(
    exe: &std::path::Path,
    point: &grid::Point,
) -> Result<grid::Measured, ModelError> {
    let config = resolve_model(point.model)?;
    let arch = memfit_plan::arch::parse_config("config.json", &config.to_string(), point.model)
        .map_err(|e| ModelError::Config(e.to_string()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["bench", "train", "--model", point.model, "--json"])
        .args(["--batch", &point.batch.to_string()])
        .args(["--seq", &point.seq.to_string()])
        .args(["--accum", &point.accum.to_string()])
        .args(["--steps", &grid::STEPS.to_string()])
        .args(["--threads", &grid::THREADS.to_string()])
        .args(["--precision", point.precision.as_str()])
        .args(["--optimizer", point.optimizer.as_str()]);
    if point.grad_ckpt {
        cmd.arg("--grad-ckpt");
    }
    if point.freeze_encoder {
        cmd.args(["--freeze", "encoder"]);
    }
    if point.lora {
        let base = if point.base_bf16 { "bf16" } else { "fp32" };
        cmd.args(["--method", "lora", "--base-precision", base])
            .args(["--lora-r", &grid::LORA_R.to_string()]);
    }
    let out = cmd
        .output()
        .map_err(|e| ModelError::Io(format!("running {}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(ModelError::Io(format!(
            "grid point {}: memfit bench train failed ({}): {}",
            point.id,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let report: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        ModelError::Io(format!(
            "grid point {}: unreadable bench output: {e}",
            point.id
        ))
    })?;
    let number = |k: &str| report[k].as_f64().unwrap_or(f64::NAN);
    Ok(grid::Measured {
        point: *point,
        dims: grid::Dims {
            family: arch.model_type.clone(),
            vocab: arch.vocab,
            d_model: arch.hidden,
            d_kv: arch.head_dim,
            d_ff: arch.ffn,
            heads: arch.heads,
            kv_heads: arch.kv_heads,
            layers: arch.encoder_layers,
            decoder_layers: arch.decoder_layers,
            tied: arch.head == memfit_plan::arch::Head::LmTied,
        },
        threads: grid::THREADS,
        steps: grid::STEPS,
        peak_rss_bytes: report["peak_rss_bytes"].as_u64().unwrap_or(0),
        sec_per_step: number("sec_per_step_median"),
    })
}

#[cfg(test)]
mod tests {
    use super::{resolve_model, set_dropout};

    #[test]
    fn planner_presets_and_bench_shapes_resolve() {
        let chatlm = resolve_model("chatlm-mini").unwrap();
        assert_eq!(
            (chatlm["vocab_size"].as_u64(), chatlm["d_model"].as_u64()),
            (Some(29_298), Some(768))
        );
        let tiny = resolve_model("tiny").unwrap();
        assert_eq!(tiny["d_model"].as_u64(), Some(256));
        let small = resolve_model("bert-small").unwrap();
        assert_eq!(small["hidden_size"].as_u64(), Some(256));
        assert!(resolve_model("no-such-model-or-file").is_err());
    }

    #[test]
    fn dropout_is_set_in_every_field_the_config_has() {
        let mut bert = resolve_model("bert-small").unwrap();
        set_dropout(&mut bert, 0.0).unwrap();
        assert_eq!(bert["hidden_dropout_prob"].as_f64(), Some(0.0));
        assert_eq!(bert["attention_probs_dropout_prob"].as_f64(), Some(0.0));
        let mut t5 = resolve_model("tiny").unwrap();
        set_dropout(&mut t5, 0.2).unwrap();
        assert_eq!(t5["dropout_rate"].as_f64(), Some(0.2));
        assert!(set_dropout(&mut t5, 1.0).is_err());
        let mut bare = serde_json::json!({"model_type": "t5"});
        let e = set_dropout(&mut bare, 0.0).unwrap_err().to_string();
        assert!(e.contains("dropout_rate"), "{e}");
    }
}
