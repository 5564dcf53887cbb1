//! Evaluation: validation loss, and greedy generation (the seed's settings: no-repeat n-gram 4,
//! repetition penalty 1.3, stop at EOS) scored by character-level BLEU-4, both the seed's formula and
//! the standard one.

pub mod bleu;

use crate::batches::{Collate, PairSource};
use crate::engine::{Engine, GenerateConfig};
use crate::text::TextDecoder;
use serde::{Deserialize, Serialize};

/// Greedy decoding with these settings is the evaluation issue 4 specifies (the seed's
/// `my_generate` used no-repeat n-gram 4 in its sampling modes; 1.3 is the specified penalty).
pub const NO_REPEAT_NGRAM: usize = 4;
pub const REPETITION_PENALTY: f32 = 1.3;

/// One evaluation's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Target-token-weighted mean loss over all validation rows.
    pub valid_loss: f64,
    /// Mean seed-formula BLEU-4 over the generated rows. (The seed's own loop averaged only its last
    /// batch, because it overwrote its score list per batch; this is the mean over every row.)
    pub bleu4: f64,
    /// Mean standard BLEU-4 (brevity penalty capped at 1).
    pub bleu4_standard: f64,
    pub rows_loss: usize,
    pub rows_generated: usize,
    /// A few (reference, generated) pairs for the log.
    pub samples: Vec<(String, String)>,
}

/// What to evaluate with.
pub struct EvalSetup<'a> {
    pub collate: Collate,
    pub batch: usize,
    /// Rows (from the start of the validation set) that are generated and scored.
    pub generate_rows: usize,
    pub max_new_tokens: usize,
    pub decoder: &'a dyn TextDecoder,
}

pub fn evaluate<E: Engine>(
    engine: &E,
    valid: &dyn PairSource,
    setup: &EvalSetup<'_>,
) -> Result<EvalReport, Box<dyn std::error::Error + Send + Sync>> {
    let batch = setup.batch.max(1);
    let (mut loss_sum, mut weight) = (0.0f64, 0.0f64);
    let mut start = 0;
    while start < valid.len() {
        let rows: Vec<_> = (start..(start + batch).min(valid.len()))
            .map(|i| valid.pair(i))
            .collect::<Result<_, _>>()?;
        let b = setup.collate.batch(&rows);
        let w = b.target_tokens() as f64;
        loss_sum += f64::from(engine.eval_loss(&b)?) * w;
        weight += w;
        start += batch;
    }
    let gen_config = GenerateConfig {
        max_new_tokens: setup.max_new_tokens,
        no_repeat_ngram: NO_REPEAT_NGRAM,
        repetition_penalty: REPETITION_PENALTY,
        eos_id: setup.collate.eos_id,
    };
    let n_gen = setup.generate_rows.min(valid.len());
    let (mut seed_sum, mut std_sum) = (0.0, 0.0);
    let mut samples = Vec::new();
    let mut start = 0;
    while start < n_gen {
        let rows: Vec<_> = (start..(start + batch).min(n_gen))
            .map(|i| valid.pair(i))
            .collect::<Result<_, _>>()?;
        let b = setup.collate.batch(&rows);
        let outputs =
            engine.generate(b.batch, b.src_len, &b.input_ids, &b.input_mask, &gen_config)?;
        for ((_, target), out) in rows.iter().zip(&outputs) {
            let reference = setup.decoder.decode(target);
            let generated = setup.decoder.decode(out);
            seed_sum += bleu::bleu4_seed(&generated, &reference);
            std_sum += bleu::bleu4_standard(&generated, &reference);
            if samples.len() < 3 {
                samples.push((reference, generated));
            }
        }
        start += batch;
    }
    let mean = |s: f64| if n_gen == 0 { 0.0 } else { s / n_gen as f64 };
    Ok(EvalReport {
        valid_loss: if weight > 0.0 {
            loss_sum / weight
        } else {
            f64::NAN
        },
        bleu4: mean(seed_sum),
        bleu4_standard: mean(std_sum),
        rows_loss: valid.len(),
        rows_generated: n_gen,
        samples,
    })
}
