//! The planner's model of memfit's GPU runtime (memfit-plan `memory/memfit_device`) held to what
//! the device placement really allocates on the code path a GPU runs: flex taking the GPU's path
//! (`set_composite_ops_on_cpu`: burn's composite ops and the device ops, which keep there what
//! cubecl's kernels keep), and a counting allocator sees each tensor it creates. flex, not ndarray, because its slices are views as cubecl's are: the device's
//! masters are laid out end to end (`optim/flat.rs`) and each weight is a view of them, which
//! ndarray would copy. Every
//! family (and the seed's T5 SFT: embeddings and encoder frozen, Adafactor) at three sizes, with
//! and without per-block checkpointing, within the model's band (10%); and the attention's kept
//! matrices, the model's largest term, pinned.
//!
//! What only a card shows (cubecl's pool rounding, the CUDA context) is `scripts/gpu/accept.sh`'s.

use burn::prelude::*;
use memfit_nn::bert::{BertConfig, BertModel};
use memfit_nn::decoder::{DecoderConfig, DecoderModel, DecoderOptions};
use memfit_nn::kernels::attention_core;
use memfit_nn::kernels::device::attention::causal_attention;
use memfit_nn::kernels::dropout::{Dropout, SplitMix64};
use memfit_nn::kernels::set_composite_ops_on_cpu;
use memfit_nn::layers::lora::LoraSettings;
use memfit_nn::model::TrainModel;
use memfit_nn::t5::{T5Config, T5Model};
use memfit_plan::memory::{
    self, FreezeGroup, Method, Optimizer as PlanOptimizer, Precision as PlanPrecision, Runtime,
    Setup,
};
use memfit_train::engine::{
    Backend, CausalLmBatch, ClassificationBatch, Engine, EngineOptions, ModelEngine, Placement,
    Seq2SeqBatch, TokenRows,
};
use memfit_train::optim::{AdafactorConfig, AdamWConfig, OptimizerConfig};
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator, counting live bytes and their peak.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// One measurement at a time: the counters are process-wide.
static MEASURING: Mutex<()> = Mutex::new(());

fn counted(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        counted(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        counted(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated beyond what was live when the counting started.
fn since(base: usize) -> usize {
    PEAK.load(Relaxed).saturating_sub(base)
}

fn rows(rng: &mut SplitMix64, batch: usize, len: usize, vocab: u64) -> TokenRows {
    let ids = (0..batch * len)
        .map(|_| 2 + rng.below(vocab - 2) as u32)
        .collect();
    TokenRows {
        batch,
        len,
        ids,
        mask: vec![true; batch * len],
    }
}

/// Peak bytes of two optimizer steps of the device placement on the GPU's code path, beyond what
/// was live before the engine, less the host copy of the weights the engine keeps (4 B per
/// parameter: on a GPU it is host memory). A pass runs first, uncounted, so that the CPU
/// backend's per-thread caches (2 MB on BERT's smallest size), which a GPU does not have, are
/// already there.
fn measured<M: TrainModel>(
    make: impl Fn() -> M,
    batch: &M::Batch,
    (training, grad_ckpt): (Training, bool),
) -> u64 {
    // one compute thread: the GEMM's per-thread packing buffers do not depend on the machine
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global();
    let host_weights: usize = make().params().iter().map(|p| 4 * p.len()).sum();
    set_composite_ops_on_cpu(true);
    let sft = training == Training::T5Sft;
    let options = EngineOptions {
        optimizer: if sft {
            OptimizerConfig::Adafactor(AdafactorConfig::default())
        } else {
            OptimizerConfig::AdamW(AdamWConfig::default())
        },
        freeze: if sft {
            T5_SFT_FROZEN.map(String::from).to_vec()
        } else {
            Vec::new()
        },
        backend: Backend::Flex,
        placement: Placement::Device,
        grad_ckpt,
        ..Default::default()
    };
    let mut warm = ModelEngine::new(make(), options.clone()).unwrap();
    warm.accumulate(batch, 1.0, 0).unwrap();
    drop(warm);
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let mut engine = ModelEngine::new(make(), options).unwrap();
    for step in 0..2 {
        engine.accumulate(batch, 1.0, step).unwrap();
        engine.step(1e-3, Some(1.0)).unwrap();
    }
    (since(base) - host_weights) as u64
}

/// How a model trains in a check: every weight with AdamW, LoRA adapters (r [`LORA_R`] on every
/// projection) with AdamW, or the seed's T5 SFT (embeddings and encoder frozen, Adafactor).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Training {
    Full,
    Lora,
    T5Sft,
}

/// The groups the seed's T5 SFT freezes.
const T5_SFT_FROZEN: [&str; 2] = ["embeddings", "encoder"];

/// The planner's peak allocated GPU bytes for `config` (a config.json) at `batch × seq`.
fn predicted(
    config: &Value,
    (batch, seq): (usize, usize),
    (training, grad_ckpt): (Training, bool),
) -> u64 {
    let arch = memfit_plan::arch::config::from_value("config.json", config, "test").unwrap();
    let mut setup = Setup::new(&arch);
    (setup.batch, setup.seq, setup.tgt_seq) = (batch as u64, seq as u64, seq as u64);
    setup.grad_ckpt = grad_ckpt;
    match training {
        Training::Full => {}
        Training::Lora => {
            setup.method = Method::Lora;
            setup.lora_r = LORA_R as u64;
            setup.lora_targets = memfit_plan::grid::memfit_lora_targets();
            setup.base_precision = Some(PlanPrecision::Fp32);
        }
        Training::T5Sft => {
            setup.method = Method::Freeze;
            setup.freeze = T5_SFT_FROZEN
                .map(|g| FreezeGroup::parse(g).unwrap())
                .to_vec();
            setup.optimizer = PlanOptimizer::Adafactor;
        }
    }
    setup.device = memory::Device::Cuda;
    setup.runtime = Runtime::Memfit;
    let e = memory::estimate(&arch, &setup, &memory::Framework::default()).unwrap();
    e.gpu.unwrap().peak_allocated_bytes
}

const SIZES: [(usize, usize); 3] = [(4, 32), (8, 64), (8, 128)];
const LORA_R: usize = 8;

/// Every size, with and without checkpointing: the prediction within 10% of the measurement.
fn assert_within_ten_percent(
    family: &str,
    config: &Value,
    training: Training,
    measure: impl Fn((usize, usize), (Training, bool)) -> u64,
) {
    // Held over the batches' making and the predictions too: any allocation on another test's
    // thread while a measurement runs counts in its peak (a full-suite run read +24 MB once).
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let mut worst: f64 = 0.0;
    for grad_ckpt in [false, true] {
        for size in SIZES {
            let m = measure(size, (training, grad_ckpt));
            let p = predicted(config, size, (training, grad_ckpt));
            let error = p as f64 / m as f64 - 1.0;
            println!(
                "| {family} | b{} s{} | {grad_ckpt} | {m} | {p} | {:+.1}% |",
                size.0,
                size.1,
                100.0 * error
            );
            worst = worst.max(error.abs());
        }
    }
    let band = memfit_plan::memory::band::MEMFIT_DEVICE;
    assert!(
        worst <= band.width,
        "{family}: worst |error| {:.1}% beyond the band's {:.0}%",
        100.0 * worst,
        100.0 * band.width
    );
}

/// The band of memfit's GPU model names the checks here: 4 trainings (T5, T5 SFT, BERT, decoder
/// LoRA) × 3 sizes × with and without checkpointing.
#[test]
fn the_device_band_counts_these_checks() {
    assert_eq!(
        memfit_plan::memory::band::MEMFIT_DEVICE.rows,
        4 * SIZES.len() * 2
    );
}

#[test]
fn t5_device_peak_is_predicted_within_ten_percent() {
    let config = json!({
        "model_type": "t5", "vocab_size": 1000, "d_model": 128, "d_kv": 32, "d_ff": 512,
        "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "dropout_rate": 0.1, "feed_forward_proj": "relu",
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    });
    let model = || T5Model::init(T5Config::from_json(&config).unwrap(), 3);
    for (name, training) in [("t5", Training::Full), ("t5 sft", Training::T5Sft)] {
        assert_within_ten_percent(name, &config, training, |(b, s), how| {
            let source = rows(&mut SplitMix64::new(5), b, s, 1000);
            let batch = Seq2SeqBatch {
                labels: source.ids.clone(),
                label_mask: source.mask.clone(),
                tgt_len: s,
                source,
            };
            measured(model, &batch, how)
        });
    }
}

#[test]
fn bert_device_peak_is_predicted_within_ten_percent() {
    let config = json!({
        "model_type": "bert", "vocab_size": 1000, "hidden_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "intermediate_size": 512, "max_position_embeddings": 256,
        "type_vocab_size": 2, "num_labels": 3,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1
    });
    let model = || BertModel::init(BertConfig::from_json(&config).unwrap(), 11);
    assert_within_ten_percent("bert", &config, Training::Full, |(b, s), how| {
        let input = rows(&mut SplitMix64::new(7), b, s, 1000);
        let labels = (0..b).map(|r| input.ids[r * s] % 3).collect();
        let batch = ClassificationBatch {
            input,
            token_types: None,
            labels,
        };
        measured(model, &batch, how)
    });
}

#[test]
fn decoder_lora_device_peak_is_predicted_within_ten_percent() {
    let config = json!({
        "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 352,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "pad_token_id": 0, "tie_word_embeddings": true
    });
    let model = || {
        let settings = LoraSettings {
            r: LORA_R,
            alpha: 16.0,
            dropout: 0.05,
            use_rslora: false,
        };
        let targets = ["q", "k", "v", "o", "gate", "up", "down"].map(String::from);
        let mut options = DecoderOptions::lora(settings, &targets)
            .unwrap()
            .with_seed(4);
        options.device = Backend::Flex.device();
        DecoderModel::init(DecoderConfig::from_json(&config).unwrap(), &options).unwrap()
    };
    assert_within_ten_percent("decoder lora", &config, Training::Lora, |(b, s), how| {
        let input = rows(&mut SplitMix64::new(9), b, s, 1000);
        // every position after a row's first is trained
        let target_mask = (0..b * s).map(|i| i % s != 0).collect();
        measured(model, &CausalLmBatch { input, target_mask }, how)
    });
}

/// On the GPU's code path an attention keeps its probabilities (the device softmax's output) and,
/// with dropout, their dropped-out copy (the product with v reads it): one `q × k` matrix, two
/// with dropout, no mask, as `memfit_device::attention_kept` counts.
#[test]
fn an_attention_keeps_its_probabilities_and_with_dropout_their_dropped_copy() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    set_composite_ops_on_cpu(true);
    let device = Backend::Flex.device();
    let [b, h, t, d] = [4, 4, 64, 32];
    let input = |seed| {
        let mut rng = SplitMix64::new(seed);
        let v: Vec<f32> = (0..b * h * t * d).map(|_| rng.next_f64() as f32).collect();
        Tensor::<4>::from_data(TensorData::new(v, [b, h, t, d]), &device)
            .autodiff()
            .require_grad()
    };
    let (q, k, v) = (input(1), input(2), input(3));
    let bias = Tensor::<4>::zeros([b, 1, 1, t], &device);
    let matrix = 4 * b * h * t * t;
    // one pass first, uncounted: flex's per-thread GEMM buffers, which a GPU does not have
    attention_core::attend(
        q.clone(),
        k.clone(),
        v.clone(),
        &bias,
        &mut Dropout::new(7, 0.1),
    );
    for (p, matrices) in [(0.0, 1), (0.1, 2)] {
        // the least of three passes: a flex worker that meets its first GEMM in a counted pass
        // allocates its buffers then (more often on a loaded machine)
        let kept = (0..3)
            .map(|_| {
                let base = LIVE.load(Relaxed);
                let mut drop = Dropout::new(7, p);
                let out = attention_core::attend(q.clone(), k.clone(), v.clone(), &bias, &mut drop);
                LIVE.load(Relaxed) - base - out.shape().num_elements() * 4
            })
            .min()
            .unwrap();
        assert!(
            (matrices * matrix..matrices * matrix + matrix / 8).contains(&kept),
            "dropout {p}: {kept} bytes kept, {matrix} bytes a matrix"
        );
    }
    set_composite_ops_on_cpu(false);
}

/// The fused causal attention (a decoder without attention dropout, `memfit_device::decoder`)
/// keeps no `q × k` matrix: what stays for backward is less than an eighth of one (the forward's
/// output is not counted; q, k, v and the mask are the caller's).
#[test]
fn the_fused_causal_attention_keeps_no_probabilities() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    set_composite_ops_on_cpu(true);
    let device = Backend::Flex.device();
    let [b, h, kv, t, d] = [4, 4, 2, 64, 32];
    let input = |seed, heads| {
        let mut rng = SplitMix64::new(seed);
        let v: Vec<f32> = (0..b * heads * t * d)
            .map(|_| rng.next_f64() as f32)
            .collect();
        Tensor::<4>::from_data(TensorData::new(v, [b, heads, t, d]), &device)
            .autodiff()
            .require_grad()
    };
    let (q, k, v) = (input(1, h), input(2, kv), input(3, kv));
    let mask = Tensor::<4>::zeros([b, 1, (h / kv) * t, t], &device);
    let matrix = 4 * b * h * t * t;
    let attend = || causal_attention(q.clone(), k.clone(), v.clone(), &mask);
    // one pass first, uncounted (flex's per-thread buffers), then the least of three
    attend();
    let kept = (0..3)
        .map(|_| {
            let base = LIVE.load(Relaxed);
            let out = attend();
            LIVE.load(Relaxed) - base - out.shape().num_elements() * 4
        })
        .min()
        .unwrap();
    assert!(
        kept < matrix / 8,
        "{kept} bytes kept, {matrix} bytes a matrix"
    );
    set_composite_ops_on_cpu(false);
}
