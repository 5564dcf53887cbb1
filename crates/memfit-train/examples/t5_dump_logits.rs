//! Writes a small trained T5 checkpoint plus `logits.safetensors` (fixed inputs and memfit's logits)
//! into OUT_DIR, for `scripts/check_t5_logits.py` to compare against transformers.
//!
//!     cargo run --release -p memfit-train --example t5_dump_logits -- OUT_DIR [relu|gated-gelu]

use std::borrow::Cow;
use std::path::PathBuf;

use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::t5::{T5Config, T5Model};
use memfit_nn::weights::{NamedTensor, write_f32};
use memfit_train::engine::{Engine, EngineOptions, ModelEngine, Seq2SeqBatch, TokenRows};
use serde_json::json;

fn batch(rng: &mut SplitMix64, vocab: u32) -> Seq2SeqBatch {
    let (b, s, t) = (3, 12, 9);
    let mut out = Seq2SeqBatch {
        source: TokenRows {
            batch: b,
            len: s,
            ids: vec![0; b * s],
            mask: vec![false; b * s],
        },
        tgt_len: t,
        labels: vec![0; b * t],
        label_mask: vec![false; b * t],
    };
    for r in 0..b {
        // Rows of different lengths so the padding masks matter.
        for i in 0..s - 3 * r {
            out.source.ids[r * s + i] = 2 + (rng.next_u64() % (vocab as u64 - 2)) as u32;
            out.source.mask[r * s + i] = true;
        }
        for i in 0..t - 2 * r {
            out.labels[r * t + i] = 2 + (rng.next_u64() % (vocab as u64 - 2)) as u32;
            out.label_mask[r * t + i] = true;
        }
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .ok_or("usage: t5_dump_logits OUT_DIR [relu|gated-gelu]")?,
    );
    let ffn = args.next().unwrap_or_else(|| "relu".into());
    let tied = ffn == "relu";
    // Long enough sequences relative to max distance 16 to reach the logarithmic buckets.
    let config = T5Config::from_json(&json!({
        "vocab_size": 96, "d_model": 48, "d_kv": 16, "d_ff": 80, "num_layers": 2,
        "num_decoder_layers": 3, "num_heads": 3, "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16, "dropout_rate": 0.1, "feed_forward_proj": ffn,
        "tie_word_embeddings": tied, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    }))?;
    let vocab = config.vocab_size as u32;
    let mut engine = ModelEngine::new(T5Model::init(config, 42), EngineOptions::default())?;
    let mut rng = SplitMix64::new(7);
    // A few steps so that norms and biases are no longer at their initial values.
    for step in 0..5 {
        engine.accumulate(&batch(&mut rng, vocab), 1.0, step)?;
        engine.step(1e-2, Some(1.0))?;
    }
    std::fs::create_dir_all(&dir)?;
    engine.save(&dir)?;
    let b = batch(&mut SplitMix64::new(99), vocab);
    let logits =
        engine
            .model()
            .logits(&engine.weights_on_device(), &b, engine.options().precision)?;
    let loss = engine.eval_loss(&b)?;
    let as_f32 = |v: &[u32]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let as_mask = |v: &[bool]| v.iter().map(|&x| x as u8 as f32).collect::<Vec<f32>>();
    let t = |name: &str, shape: Vec<usize>, values: Vec<f32>| NamedTensor {
        name: name.into(),
        shape,
        values: Cow::Owned(values),
        transpose: None,
    };
    write_f32(
        &dir.join("logits.safetensors"),
        &[
            t(
                "input_ids",
                vec![b.source.batch, b.source.len],
                as_f32(&b.source.ids),
            ),
            t(
                "attention_mask",
                vec![b.source.batch, b.source.len],
                as_mask(&b.source.mask),
            ),
            t("labels", vec![b.source.batch, b.tgt_len], as_f32(&b.labels)),
            t(
                "label_mask",
                vec![b.source.batch, b.tgt_len],
                as_mask(&b.label_mask),
            ),
            t(
                "logits",
                vec![b.source.batch, b.tgt_len, vocab as usize],
                logits,
            ),
            t("loss", vec![1], vec![loss]),
        ],
        None,
    )?;
    println!("wrote {} (loss {loss:.6})", dir.display());
    Ok(())
}
