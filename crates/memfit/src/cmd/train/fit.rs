//! The settings of a run on real data (`--data`, `--init`) that come from the task, the model and the
//! data rather than the demo: the task's defaults (`memfit_train::task_defaults`), the sequence
//! length from the longest prepared row, the line that says what was chosen and why, and the
//! settings that cannot be right, caught before anything is created.

use std::path::Path;

use crate::exit::bad_input;
use memfit_data::StoreMeta;
use memfit_nn::families::Positions;
use memfit_train::config::{ConfigLayer, OptimizerKind, TaskKind, TrainConfig};
use memfit_train::run_data::{self, RunData};
use memfit_train::task_defaults::TaskDefaults;

/// The sequence length a run plans for when the model names no positions (a T5 config without
/// `n_positions`): T5's own 512 (transformers' `model_max_length` for t5-small … t5-11b).
pub const DEFAULT_POSITIONS: usize = 512;

/// A sequence length from the data is rounded up to a multiple of this (whole SIMD/tensor-core tiles).
const SEQ_MULTIPLE: usize = 8;

/// Truncation that cuts more than this share of the rows is warned about.
const TRUNCATION_WARNING_SHARE: f64 = 0.05;

/// What the defaults chose for a run on real data.
#[derive(Debug, Clone, Default)]
pub struct Fit {
    /// "lr 5e-5 (classification, full)", … in the order printed.
    pub chosen: Vec<String>,
    /// No layer set `seq` (and, for seq2seq, `tgt_seq`): they come from the prepared data.
    pub seq_from_data: bool,
    pub tgt_seq_from_data: bool,
}

impl Fit {
    /// The line printed at the start of the run: every value chosen for the user, with why.
    pub fn line(&self) -> Option<String> {
        (!self.chosen.is_empty()).then(|| {
            format!(
                "chosen for this run (docs/train.md, \"Defaults\"): {}",
                self.chosen.join(", ")
            )
        })
    }
}

/// The task defaults `d` that no layer overrode, as the start line names them.
pub fn chosen(layers: &[ConfigLayer], config: &TrainConfig, d: &TaskDefaults) -> Vec<String> {
    let set = |f: fn(&ConfigLayer) -> bool| layers.iter().any(f);
    let row = d.row;
    let mut out = Vec::new();
    if !set(|l| l.lr.is_some()) {
        out.push(format!("lr {:e} ({row})", config.lr));
    }
    if !set(|l| l.schedule.is_some() || l.warmup_steps.is_some()) {
        let pct = 100.0 * config.warmup_ratio.unwrap_or(0.0);
        out.push(format!("cosine decay after a {pct:.0}% warm-up ({row})"));
    }
    if !set(|l| l.optimizer.is_some()) {
        let name = match config.optimizer {
            OptimizerKind::Adamw => "AdamW",
            OptimizerKind::Adafactor => "Adafactor at the scheduled rate",
        };
        out.push(format!("{name} ({row})"));
    }
    if !set(|l| l.epochs.is_some()) && config.max_steps.is_none() {
        out.push(format!("{} epochs ({row})", config.epochs));
    }
    if !set(|l| l.batch.is_some() || l.accum.is_some()) {
        out.push(format!("batch {} ({row})", config.batch * config.accum));
    }
    out
}

/// The model's positions as the sequence length a run on real data may take: the position table's
/// length, what a decoder or T5 was trained for, else [`DEFAULT_POSITIONS`].
pub fn max_seq(positions: Option<Positions>) -> usize {
    positions.map_or(DEFAULT_POSITIONS, |p| p.limit)
}

/// `seq` beyond a position table is refused (exit 2) before anything is created; beyond the
/// positions a model was trained for, warned about.
pub fn check_seq(config: &TrainConfig, positions: Option<Positions>) -> anyhow::Result<()> {
    let Some(p) = positions.filter(|p| config.seq > p.limit) else {
        return Ok(());
    };
    let what = format!(
        "--seq {}: model {} has {} positions",
        config.seq, config.model, p.limit
    );
    if p.hard {
        return Err(bad_input(format!(
            "{what} (max_position_embeddings): give --seq {} or less, or leave --seq out to take \
             it from the data",
            p.limit
        )));
    }
    eprintln!("warning: {what}; it was not trained on longer sequences");
    Ok(())
}

/// A learning rate an order of magnitude from the defaults' for an `--init` fine-tune is warned
/// about (not refused: the user may know better).
pub fn warn_lr(layers: &[ConfigLayer], config: &TrainConfig, d: &TaskDefaults) {
    let given = layers.iter().any(|l| l.lr.is_some());
    if given && config.init.is_some() && d.lr_factor(config.lr) >= 10.0 {
        eprintln!(
            "warning: lr {:e} is {:.0}× {} the {:e} of the defaults for {} (docs/train.md, \
             \"Defaults\"): a fine-tune at this rate may not learn, or may collapse",
            config.lr,
            d.lr_factor(config.lr),
            if config.lr > d.lr { "above" } else { "below" },
            d.lr,
            d.row
        );
    }
}

/// Longest prepared rows: (source or whole row, seq2seq target), specials and EOS included.
pub fn longest_rows(task: TaskKind, data: &RunData) -> anyhow::Result<(usize, usize)> {
    let stores = std::iter::once(&data.train.0).chain(data.valid.iter().map(|v| &v.0));
    let (mut src, mut tgt) = (0, 0);
    for store in stores {
        let lengths = &store.meta().lengths;
        if task == TaskKind::Seq2seq {
            src = src.max(lengths.first().map_or(0, |l| l.max as usize));
            tgt = tgt.max(lengths.get(1).map_or(0, |l| l.max as usize));
        } else {
            let rows = store.row_lengths().map_err(|e| bad_input(e.to_string()))?;
            src = src.max(rows.into_iter().max().unwrap_or(0) as usize);
        }
    }
    Ok((src, tgt))
}

/// The sequence length that holds `longest` tokens, at most `cap`.
pub fn seq_for(longest: usize, cap: usize) -> usize {
    longest
        .div_ceil(SEQ_MULTIPLE)
        .max(1)
        .saturating_mul(SEQ_MULTIPLE)
        .min(cap)
}

/// Warns when preparing the data cut more than 5% of a store's rows, with the count.
pub fn warn_truncation(data: &RunData, config: &TrainConfig) {
    let stores = [
        ("training", Some(&data.train.0), config.data.as_deref()),
        (
            "validation",
            data.valid.as_ref().map(|v| &v.0),
            config.valid.as_deref(),
        ),
    ];
    for (name, store, given) in stores {
        let Some(meta) = store.map(|s| s.meta()) else {
            continue;
        };
        // a store given as it is was cut when it was prepared; one this run prepared, at its --seq
        let given_store = given.is_some_and(|p| run_data::is_store(Path::new(p)));
        if let Some(warning) = truncation_warning(name, meta, config, given_store) {
            eprintln!("warning: {warning}");
        }
    }
}

/// The warning for a store that lost more than 5% of its rows' ends, and what keeps them: a longer
/// `--seq` where this run prepared it, preparing it again with a larger `--max-len` where it was
/// given prepared.
fn truncation_warning(
    name: &str,
    meta: &StoreMeta,
    config: &TrainConfig,
    given_store: bool,
) -> Option<String> {
    let counts = &meta.counts;
    let share = counts.truncated as f64 / counts.written.max(1) as f64;
    if share <= TRUNCATION_WARNING_SHARE {
        return None;
    }
    let seq2seq = config.task == TaskKind::Seq2seq;
    let cut = format!(
        "cuts {} of {} {name} rows ({:.1}%): their ends are lost",
        counts.truncated,
        counts.written,
        100.0 * share
    );
    let lengths = |a: Option<usize>, b: Option<usize>| {
        let show = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
        match seq2seq {
            true => format!("{} / {}", show(a), show(b)),
            false => show(a),
        }
    };
    Some(if given_store {
        let o = &meta.options;
        format!(
            "the {name} store, prepared at --max-len {}, {cut}; `memfit data prepare` with a larger \
             --max-len{} keeps them",
            lengths(o.max_len, o.max_target_len),
            if seq2seq { " / --max-target-len" } else { "" },
        )
    } else {
        format!(
            "seq {} {cut}; a longer --seq{} keeps them",
            lengths(Some(config.seq), Some(config.tgt_seq)),
            if seq2seq { " / --tgt-seq" } else { "" },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_rounds_up_to_whole_tiles_within_the_cap() {
        assert_eq!(seq_for(61, 512), 64);
        assert_eq!(seq_for(64, 512), 64);
        assert_eq!(seq_for(65, 512), 72);
        assert_eq!(seq_for(900, 512), 512);
        assert_eq!(seq_for(0, 512), 8);
    }

    #[test]
    fn a_hard_position_limit_refuses_a_longer_seq_and_a_soft_one_does_not() {
        let c = TrainConfig {
            seq: 600,
            model: "bert".into(),
            ..TrainConfig::default()
        };
        let hard = Positions {
            limit: 512,
            hard: true,
        };
        let err = check_seq(&c, Some(hard)).unwrap_err().to_string();
        assert!(err.contains("--seq 600") && err.contains("512"), "{err}");
        let soft = Positions {
            hard: false,
            ..hard
        };
        check_seq(&c, Some(soft)).unwrap();
        check_seq(&c, None).unwrap();
    }
}
