//! The T5 engine on tiny generated models: shapes, checkpoints in transformers' layout, freezing,
//! accumulation, determinism and exact resume.

use memfit_nn::ModelError;
use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::t5::{Group, T5Config, T5Layout, T5Model};
use memfit_train::engine::{
    Engine, EngineOptions, Generate, GenerateConfig, ModelEngine, Precision, Seq2SeqBatch,
    TokenRows,
};
use memfit_train::optim::{AdafactorConfig, AdamWConfig, OptimizerConfig};
use serde_json::json;

/// The engine of a T5.
type T5Engine = ModelEngine<T5Model>;

/// A T5 engine with weights drawn from `seed`.
fn t5_engine(config: T5Config, options: EngineOptions, seed: u64) -> Result<T5Engine, ModelError> {
    ModelEngine::new(T5Model::init(config, seed), options)
}

/// What the tests read of a T5 engine.
trait T5Checks {
    fn logits(&self, b: &Seq2SeqBatch) -> Result<Vec<f32>, ModelError>;
}

impl T5Checks for T5Engine {
    fn logits(&self, b: &Seq2SeqBatch) -> Result<Vec<f32>, ModelError> {
        let params = self.weights_on_device();
        self.model().logits(&params, b, self.options().precision)
    }
}

/// Group names as `--freeze` takes them.
fn groups(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

const VOCAB: usize = 64;

fn tiny(extra: serde_json::Value) -> T5Config {
    let mut base = json!({
        "vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
        "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16, "dropout_rate": 0.0,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    });
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    T5Config::from_json(&base).unwrap()
}

fn adamw(lr_wd: f64) -> EngineOptions {
    EngineOptions {
        optimizer: OptimizerConfig::AdamW(AdamWConfig {
            weight_decay: lr_wd,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Copy task: the target is the source; some rows shorter (padded) to exercise the masks.
fn copy_batch(rng: &mut SplitMix64, batch: usize, len: usize) -> Seq2SeqBatch {
    copy_batch_of(rng, batch, len, VOCAB as u64 - 3)
}

/// Copy task over `words` distinct tokens.
fn copy_batch_of(rng: &mut SplitMix64, batch: usize, len: usize, words: u64) -> Seq2SeqBatch {
    let mut b = Seq2SeqBatch {
        source: TokenRows {
            batch,
            len,
            ids: vec![0; batch * len],
            mask: vec![false; batch * len],
        },
        tgt_len: len,
        labels: vec![0; batch * len],
        label_mask: vec![false; batch * len],
    };
    for r in 0..batch {
        let n = len - (r % 3);
        for t in 0..n {
            let id = if t + 1 == n {
                1
            } else {
                3 + (rng.next_u64() % words) as u32
            };
            b.source.ids[r * len + t] = id;
            b.source.mask[r * len + t] = true;
            b.labels[r * len + t] = id;
            b.label_mask[r * len + t] = true;
        }
    }
    b
}

fn full_batch(rng: &mut SplitMix64, batch: usize, len: usize) -> Seq2SeqBatch {
    let mut b = copy_batch(rng, batch, len);
    for r in 0..batch {
        for t in 0..len {
            let id = 3 + (rng.next_u64() % (VOCAB as u64 - 3)) as u32;
            b.source.ids[r * len + t] = id;
            b.labels[r * len + t] = id;
        }
    }
    b.source.mask.iter_mut().for_each(|m| *m = true);
    b.label_mask.iter_mut().for_each(|m| *m = true);
    b
}

#[test]
fn logits_have_batch_times_target_by_vocab() {
    let engine = t5_engine(tiny(json!({})), adamw(0.0), 1).unwrap();
    let b = copy_batch(&mut SplitMix64::new(2), 3, 5);
    let logits = engine.logits(&b).unwrap();
    assert_eq!(logits.len(), 3 * 5 * VOCAB);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn t5_small_names_shapes_and_count_match_transformers() {
    // transformers' T5Config() defaults are t5-small: 60,506,624 parameters, 131 tensors in its
    // state dict once the tied embedding aliases are dropped.
    let layout = T5Layout::new(&T5Config::from_json(&json!({})).unwrap());
    assert_eq!(layout.param_counts(&[]).0, 60_506_624);
    assert_eq!(layout.specs.len(), 131);
    let shape = |name: &str| layout.specs[layout.index_of(name).unwrap()].kind.hf_shape();
    assert_eq!(shape("shared.weight"), vec![32128, 512]);
    assert_eq!(
        shape("encoder.block.0.layer.0.SelfAttention.q.weight"),
        vec![512, 512]
    );
    assert_eq!(
        shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        vec![32, 8]
    );
    assert_eq!(
        shape("encoder.block.5.layer.1.DenseReluDense.wi.weight"),
        vec![2048, 512]
    );
    assert_eq!(
        shape("encoder.block.5.layer.1.DenseReluDense.wo.weight"),
        vec![512, 2048]
    );
    assert_eq!(shape("encoder.final_layer_norm.weight"), vec![512]);
    assert_eq!(
        shape("decoder.block.3.layer.1.EncDecAttention.o.weight"),
        vec![512, 512]
    );
    assert_eq!(
        shape("decoder.block.5.layer.2.layer_norm.weight"),
        vec![512]
    );
    assert_eq!(
        shape("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        vec![32, 8]
    );
    // Only block 0 of each stack holds the bias.
    assert!(
        layout
            .index_of("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight")
            .is_none()
    );
    assert!(layout.index_of("lm_head.weight").is_none());
}

#[test]
fn chatlm_mini_sft_counts() {
    // ChatLM-mini-Chinese: d_model 768, d_ff 3072, 12 heads, d_kv 64, 10+10 layers, vocab 29298.
    let cfg = T5Config::from_json(&json!({
        "vocab_size": 29298, "d_model": 768, "d_ff": 3072, "num_heads": 12, "d_kv": 64,
        "num_layers": 10, "num_decoder_layers": 10
    }))
    .unwrap();
    let layout = T5Layout::new(&cfg);
    assert_eq!(
        layout.param_counts(&[Group::Embeddings, Group::Encoder]),
        (187_692_288, 94_396_032)
    );
}

#[test]
fn gated_untied_variant_has_its_own_tensors() {
    let cfg = tiny(json!({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false}));
    let layout = T5Layout::new(&cfg);
    for name in [
        "encoder.block.0.layer.1.DenseReluDense.wi_0.weight",
        "encoder.block.0.layer.1.DenseReluDense.wi_1.weight",
        "decoder.block.1.layer.2.DenseReluDense.wi_1.weight",
        "lm_head.weight",
    ] {
        assert!(layout.index_of(name).is_some(), "{name}");
    }
    assert!(
        layout
            .index_of("encoder.block.0.layer.1.DenseReluDense.wi.weight")
            .is_none()
    );
    let tied = T5Layout::new(&tiny(json!({})));
    assert_eq!(
        layout.param_counts(&[]).0 - tied.param_counts(&[]).0,
        (VOCAB * 32 + 4 * 32 * 64) as u64
    );
    // Untied and gated models run and differ from the tied ReLU one built from the same seed.
    let b = copy_batch(&mut SplitMix64::new(3), 2, 4);
    let a = t5_engine(cfg, adamw(0.0), 7).unwrap().logits(&b).unwrap();
    let t = t5_engine(tiny(json!({})), adamw(0.0), 7)
        .unwrap()
        .logits(&b)
        .unwrap();
    assert_eq!(a.len(), t.len());
    assert_ne!(a, t);
}

#[test]
fn safetensors_round_trip_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    for extra in [
        json!({}),
        json!({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false}),
    ] {
        let model = T5Model::init(tiny(extra), 11);
        model.save(dir.path()).unwrap();
        let (back, report) = T5Model::load(dir.path()).unwrap();
        assert!(report.unused.is_empty(), "{report:?}");
        assert_eq!(back.config.to_json(), model.config.to_json());
        assert_eq!(back.weights.len(), model.weights.len());
        for (a, b) in back.weights.iter().zip(&model.weights) {
            let (a, b): (Vec<u32>, Vec<u32>) = (
                a.iter().map(|x| x.to_bits()).collect(),
                b.iter().map(|x| x.to_bits()).collect(),
            );
            assert_eq!(a, b);
        }
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["architectures"][0], "T5ForConditionalGeneration");
}

#[test]
fn loading_a_checkpoint_of_another_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    T5Model::init(tiny(json!({"d_ff": 48})), 1)
        .save(dir.path())
        .unwrap();
    let mut engine = t5_engine(tiny(json!({})), adamw(0.0), 1).unwrap();
    let err = engine.load(dir.path(), false).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    // Weights whose shapes disagree with config.json name the tensor.
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&tiny(json!({})).to_json()).unwrap(),
    )
    .unwrap();
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("DenseReluDense.wi.weight") && err.contains("shape"),
        "{err}"
    );
}

#[test]
fn out_of_vocabulary_ids_are_an_error_not_a_panic() {
    let mut engine = t5_engine(tiny(json!({})), adamw(0.0), 1).unwrap();
    let mut b = copy_batch(&mut SplitMix64::new(1), 2, 4);
    b.source.ids[3] = VOCAB as u32;
    let err = engine.accumulate(&b, 1.0, 0).unwrap_err().to_string();
    assert!(err.contains("input_ids[3]"), "{err}");
    b.source.ids.pop();
    assert!(engine.eval_loss(&b).is_err());
}

#[test]
fn loss_falls_on_a_copy_task() {
    let mut engine = t5_engine(tiny(json!({})), adamw(0.0), 5).unwrap();
    let mut rng = SplitMix64::new(9);
    // Short sequences over 8 words: learnable by a 2+2-layer d_model 32 model in a few dozen steps.
    let eval = copy_batch_of(&mut SplitMix64::new(1234), 16, 4, 8);
    let before = engine.eval_loss(&eval).unwrap();
    for step in 0..60 {
        let b = copy_batch_of(&mut rng, 16, 4, 8);
        engine.accumulate(&b, 1.0, step).unwrap();
        engine.step(1e-2, Some(1.0)).unwrap();
    }
    let after = engine.eval_loss(&eval).unwrap();
    println!("eval loss {before} → {after}");
    assert!(after < 0.5 * before, "eval loss {before} → {after}");
}

#[test]
fn frozen_modules_do_not_change() {
    let options = EngineOptions {
        freeze: groups(&["embeddings", "encoder"]),
        ..adamw(0.01)
    };
    let mut engine = t5_engine(tiny(json!({"dropout_rate": 0.1})), options, 3).unwrap();
    let before = engine.model().weights.clone();
    let b = copy_batch(&mut SplitMix64::new(4), 4, 5);
    engine.accumulate(&b, 1.0, 1).unwrap();
    engine.step(1e-2, Some(1.0)).unwrap();
    let layout = &engine.model().layout;
    let mut moved_decoder = false;
    for (i, spec) in layout.specs.iter().enumerate() {
        let same = engine.model().weights[i] == before[i];
        match spec.group {
            Group::Embeddings | Group::Encoder => assert!(same, "{} changed", spec.name),
            _ => moved_decoder |= !same,
        }
    }
    assert!(moved_decoder);
    let counts = engine.param_counts();
    assert!(counts.trainable < counts.total);
}

#[test]
fn accumulating_two_halves_equals_one_double_batch() {
    let mut rng = SplitMix64::new(21);
    let a = full_batch(&mut rng, 3, 5);
    let b = full_batch(&mut rng, 3, 5);
    let mut both = a.clone();
    both.source.batch = 6;
    both.source.ids.extend(&b.source.ids);
    both.source.mask.extend(&b.source.mask);
    both.labels.extend(&b.labels);
    both.label_mask.extend(&b.label_mask);
    let mut split = t5_engine(tiny(json!({})), adamw(0.01), 8).unwrap();
    let mut whole = t5_engine(tiny(json!({})), adamw(0.01), 8).unwrap();
    split.accumulate(&a, 0.5, 1).unwrap();
    split.accumulate(&b, 0.5, 2).unwrap();
    whole.accumulate(&both, 1.0, 1).unwrap();
    let (ns, nw) = (split.accumulated_grad_norm(), whole.accumulated_grad_norm());
    assert!((ns - nw).abs() < 1e-5 * nw, "grad norms {ns} vs {nw}");
    split.step(1e-3, None).unwrap();
    whole.step(1e-3, None).unwrap();
    for (x, y) in split
        .model()
        .weights
        .iter()
        .flatten()
        .zip(whole.model().weights.iter().flatten())
    {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

fn train(engine: &mut T5Engine, steps: std::ops::Range<u64>) {
    for step in steps {
        let mut rng = SplitMix64::new(100 + step);
        for micro in 0..2 {
            let b = copy_batch(&mut rng, 4, 5);
            engine.accumulate(&b, 0.5, step * 2 + micro).unwrap();
        }
        engine.step(3e-3, Some(1.0)).unwrap();
    }
}

fn bits(engine: &T5Engine) -> Vec<u32> {
    engine
        .model()
        .weights
        .iter()
        .flatten()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn same_seed_same_weights() {
    let cfg = tiny(json!({"dropout_rate": 0.1}));
    let mut a = t5_engine(cfg.clone(), adamw(0.01), 4).unwrap();
    let mut b = t5_engine(cfg, adamw(0.01), 4).unwrap();
    train(&mut a, 0..3);
    train(&mut b, 0..3);
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn save_load_continue_equals_uninterrupted() {
    let cfg = tiny(json!({"dropout_rate": 0.1}));
    for optimizer in [
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::Adafactor(AdafactorConfig::default()),
    ] {
        let options = EngineOptions {
            optimizer,
            ..Default::default()
        };
        let mut straight = t5_engine(cfg.clone(), options.clone(), 6).unwrap();
        train(&mut straight, 0..4);

        let mut first = t5_engine(cfg.clone(), options.clone(), 6).unwrap();
        train(&mut first, 0..2);
        let dir = tempfile::tempdir().unwrap();
        first.save(dir.path()).unwrap();
        drop(first);
        // A fresh engine (different init seed) restored from the checkpoint.
        let mut resumed = t5_engine(cfg.clone(), options, 999).unwrap();
        resumed.load(dir.path(), true).unwrap();
        assert_eq!(resumed.optimizer_step(), 2);
        train(&mut resumed, 2..4);
        assert_eq!(bits(&resumed), bits(&straight));
    }
}

#[test]
fn generate_stops_at_eos_and_at_the_limit() {
    let engine = t5_engine(tiny(json!({})), adamw(0.0), 2).unwrap();
    let b = copy_batch(&mut SplitMix64::new(5), 2, 5);
    let cfg = GenerateConfig {
        max_new_tokens: 7,
        no_repeat_ngram: 2,
        repetition_penalty: 1.3,
        eos_id: 1,
        stop: Vec::new(),
    };
    let out = engine.generate(&b.source, &cfg).unwrap();
    assert_eq!(out.len(), 2);
    for row in &out {
        assert!(row.len() <= 7);
        assert!(!row.contains(&1));
        // No bigram repeats under no_repeat_ngram 2 (the decoder start token counts as context).
        let mut seq = vec![0u32];
        seq.extend(row);
        let grams: Vec<_> = seq.windows(2).collect();
        let unique: std::collections::HashSet<_> = grams.iter().collect();
        assert_eq!(grams.len(), unique.len(), "{row:?}");
    }
}

#[test]
fn generate_ends_after_one_token_once_a_stop_is_requested() {
    let engine = t5_engine(tiny(json!({})), adamw(0.0), 2).unwrap();
    let b = copy_batch(&mut SplitMix64::new(5), 2, 5);
    let stop = memfit_train::signals::StopFlag::new();
    stop.request();
    let cfg = GenerateConfig {
        max_new_tokens: 7,
        no_repeat_ngram: 0,
        repetition_penalty: 1.0,
        eos_id: u32::MAX,
        stop: vec![stop.signal()],
    };
    let out = engine.generate(&b.source, &cfg).unwrap();
    // The flag is polled after each token: one token per row, not seven.
    assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1]);
}

/// Loss and accumulated gradients of two micro-batches on a fresh engine.
fn loss_and_grads(cfg: T5Config, options: EngineOptions) -> (Vec<f32>, Vec<Option<Vec<f32>>>) {
    let mut engine = t5_engine(cfg, options, 5).unwrap();
    let mut rng = SplitMix64::new(17);
    let losses = (0..2)
        .map(|micro| {
            let b = copy_batch(&mut rng, 3, 6);
            engine.accumulate(&b, 0.5, 40 + micro).unwrap()
        })
        .collect();
    (losses, engine.accumulated_gradients())
}

#[test]
fn per_block_checkpointing_gives_the_same_loss_and_gradients() {
    let cases = [
        // Dropout on: the recomputed blocks must replay the first pass's masks.
        (tiny(json!({"dropout_rate": 0.1})), vec![]),
        (
            tiny(json!({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false})),
            vec![],
        ),
        // The seed's SFT mode: no gradient reaches the embedding or the encoder.
        (
            tiny(json!({"dropout_rate": 0.1})),
            groups(&["embeddings", "encoder"]),
        ),
        // Only the encoder trains: cotangents must travel back through the whole decoder.
        (
            tiny(json!({})),
            groups(&["embeddings", "decoder", "lm_head"]),
        ),
    ];
    for (cfg, freeze) in cases {
        let options = |grad_ckpt| EngineOptions {
            freeze: freeze.clone(),
            grad_ckpt,
            ..adamw(0.0)
        };
        let (plain_loss, plain) = loss_and_grads(cfg.clone(), options(false));
        let (ckpt_loss, ckpt) = loss_and_grads(cfg, options(true));
        for (p, c) in plain_loss.iter().zip(&ckpt_loss) {
            // The same ops on the same values; tracked and untracked kernels may round differently.
            assert!(
                (p - c).abs() <= 1e-6 * p.abs(),
                "freeze {freeze:?}: loss {p} vs {c}"
            );
        }
        let mut compared = 0;
        for (i, (p, c)) in plain.iter().zip(&ckpt).enumerate() {
            match (p, c) {
                (None, None) => {}
                (Some(p), Some(c)) => {
                    let scale = p.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                    for (x, y) in p.iter().zip(c) {
                        assert!((x - y).abs() <= 1e-4 * scale, "param {i}: {x} vs {y}");
                    }
                    compared += 1;
                }
                _ => panic!("freeze {freeze:?}: param {i} has a gradient in only one mode"),
            }
        }
        assert!(compared > 0, "freeze {freeze:?}: no gradient compared");
    }
}

/// The gradients of `loss_scale × loss` by burn's autodiff through the plain forward pass (the
/// lookup through `select`, logits `[tokens, vocab]` at once): what the engine must reproduce with
/// its embedding leaves, chunked head and hand-written ops.
fn autodiff_gradients(
    model: &T5Model,
    precision: Precision,
    b: &Seq2SeqBatch,
    loss_scale: f32,
    seed: u64,
) -> Vec<Vec<f32>> {
    use burn::prelude::*;
    use burn::tensor::{DType, TensorData};
    use memfit_nn::kernels::dropout::Dropout;
    use memfit_nn::layers::loss::{masked_cross_entropy, shift_right};
    use memfit_nn::t5::forward::{T5Forward, padding_mask};

    let device = Device::flex();
    let leaves: Vec<Tensor<2>> = model
        .weights
        .iter()
        .zip(&model.layout.specs)
        .map(|(w, spec)| {
            Tensor::from_data(TensorData::new(w.clone(), spec.kind.shape()), &device)
                .autodiff()
                .require_grad()
        })
        .collect();
    let dtype = match precision {
        Precision::Fp32 => DType::F32,
        Precision::Bf16 => DType::BF16,
    };
    let fwd = T5Forward::of(model, &leaves, dtype);
    let ids = |v: Vec<i64>, len| {
        Tensor::<2, Int>::from_data(TensorData::new(v, [b.source.batch, len]), &device)
    };
    let cfg = &model.config;
    let decoder_ids = shift_right(
        &b.labels,
        &b.label_mask,
        b.source.batch,
        b.tgt_len,
        cfg.decoder_start_token_id,
        cfg.pad_token_id,
    );
    let mask = padding_mask(
        &b.source.mask,
        b.source.batch,
        b.source.len,
        &device,
        DType::F32,
    );
    let hidden = fwd.encode_decode(
        ids(
            b.source.ids.iter().map(|&i| i as i64).collect(),
            b.source.len,
        ),
        &mask,
        ids(
            decoder_ids.iter().map(|&i| i64::from(i)).collect(),
            b.tgt_len,
        ),
        &mut Dropout::new(seed, cfg.dropout_rate),
    );
    // Logits and loss in f32, as the engine's head computes them.
    let logits = fwd.lm_logits(hidden.cast(DType::F32));
    let loss = masked_cross_entropy(logits, &b.labels, &b.label_mask) * loss_scale;
    let grads = loss.backward();
    leaves
        .iter()
        .map(|l| l.grad(&grads).unwrap().into_data().try_to_vec().unwrap())
        .collect()
}

#[test]
fn engine_gradients_equal_autodiff_through_the_whole_model() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        for tied in [true, false] {
            let cfg = tiny(json!({"dropout_rate": 0.1, "tie_word_embeddings": tied}));
            let options = EngineOptions {
                precision,
                ..adamw(0.0)
            };
            let mut engine = t5_engine(cfg, options, 5).unwrap();
            let b = copy_batch(&mut SplitMix64::new(17), 3, 6);
            let reference = autodiff_gradients(engine.model(), precision, &b, 0.5, 40);
            engine.accumulate(&b, 0.5, 40).unwrap();
            // bf16: the same ops on the same bf16 activations; only summation orders differ.
            let tol = match precision {
                Precision::Fp32 => 1e-5,
                Precision::Bf16 => 2e-3,
            };
            for (i, (g, r)) in engine
                .accumulated_gradients()
                .iter()
                .zip(&reference)
                .enumerate()
            {
                let g = g.as_ref().expect("every parameter trains");
                let scale = r.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                for (x, y) in g.iter().zip(r) {
                    assert!(
                        (x - y).abs() <= tol * scale,
                        "{precision:?}, tied {tied}: {}: {x} vs {y}",
                        engine.model().layout.specs[i].name
                    );
                }
            }
        }
    }
}

#[test]
fn cached_decoding_equals_the_full_decoder_at_every_position() {
    use burn::prelude::*;
    use burn::tensor::{DType, TensorData};
    use memfit_nn::kernels::dropout::Dropout;
    use memfit_nn::t5::forward::{T5Forward, padding_mask};

    for cfg in [
        tiny(json!({})),
        tiny(json!({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false})),
    ] {
        let model = T5Model::init(cfg, 9);
        let device = Device::flex();
        let params = model.tensors(&device, DType::F32);
        let fwd = T5Forward::of(&model, &params, DType::F32);
        // 20 positions pass the tiny config's max distance (16): the log-spaced buckets are used.
        let (b, s, t) = (2, 7, 20);
        let b_src = copy_batch(&mut SplitMix64::new(4), b, s);
        let ids =
            |v: Vec<i64>, len| Tensor::<2, Int>::from_data(TensorData::new(v, [b, len]), &device);
        let src: Vec<i64> = b_src.source.ids.iter().map(|&i| i as i64).collect();
        let mask = padding_mask(&b_src.source.mask, b, s, &device, DType::F32);
        let mut drop = Dropout::disabled();
        let encoded = fwd.encode(ids(src, s), &mask, &mut drop);
        let mut rng = SplitMix64::new(8);
        let dec: Vec<i64> = (0..b * t)
            .map(|_| (rng.next_u64() % VOCAB as u64) as i64)
            .collect();
        let full = fwd.decode(ids(dec.clone(), t), &encoded, &mask, &mut drop);
        let mut cache = fwd.decoder_cache(&encoded);
        for pos in 0..t {
            let column = (0..b).map(|r| dec[r * t + pos]).collect();
            let step = fwd.decode_step(ids(column, 1), &mut cache, &mask);
            let want = full
                .clone()
                .slice([0..b, pos..pos + 1, 0..model.config.d_model]);
            let diff: f32 = (step - want).abs().max().into_scalar();
            assert!(diff < 1e-5, "position {pos}: max abs diff {diff}");
        }
    }
}

/// The validation loss runs the head in chunks (issue 29: whole logits made evaluation the run's
/// peak); it is still the masked cross-entropy of the whole logits, computed here in f64.
#[test]
fn eval_loss_in_chunks_is_the_cross_entropy_of_the_whole_logits() {
    let engine = t5_engine(tiny(json!({})), adamw(0.0), 5).unwrap();
    let mut b = copy_batch_of(&mut SplitMix64::new(3), 6, 5, 8);
    b.label_mask[7] = false; // a padded target is left out
    let logits = engine.logits(&b).unwrap();
    let (mut sum, mut n) = (0.0f64, 0usize);
    for (row, (&label, &kept)) in b.labels.iter().zip(&b.label_mask).enumerate() {
        if !kept {
            continue;
        }
        let z = &logits[row * VOCAB..(row + 1) * VOCAB];
        let max = z.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let log_sum = z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        sum += log_sum - z[label as usize] as f64;
        n += 1;
    }
    let expected = sum / n as f64;
    let got = f64::from(engine.eval_loss(&b).unwrap());
    assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
}
