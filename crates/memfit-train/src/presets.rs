//! The seed's named training configurations as data (layers over the defaults), not code paths.
//!
//! Sources, in charent/ChatLM-mini-Chinese (commit 2696eb8):
//! - `pretrain`: `config.py` `TrainConfig` as `model/trainer.py` runs it — `torch_optimizer.Adafactor`
//!   with its default relative step (so the attached `OneCycleLR(max_lr = div_factor × learn_rate =
//!   50 × 1e-4, div_factor = 50)` is computed and logged but does not move the weights),
//!   batch 16 × accumulation 8, 8 epochs, max_seq_len 256, clip 1.0, save every 10,000 steps, keep 8,
//!   seed 23333.
//! - `sft`: `config.py` `SFTconfig` as `sft_train.py` runs it through `Seq2SeqTrainer` — Adafactor at
//!   1e-5 with 100 warm-up steps, batch 12 × accumulation 4, 4 epochs, max_seq_len 384 + 8, save every
//!   5,000 steps, `save_total_limit = 3`. transformers' default decay after warm-up is linear; memfit's
//!   nearest schedule is warm-up + cosine (a documented difference).
//! - `sft-small`: the fine-tune mode of `model/trainer.py` (`is_finetune = True`): the pretrain values with
//!   the shared embeddings and the encoder frozen (94,396,032 of 187,692,288 parameters train).
//! - `sft-fast`: `sft-small` at the seed's earlier `TrainConfig.max_seq_len = 128` (config.py before commit 9375652)
//!   — the seed's source has no profile by this name; memfit names it so the short-sequence variant is one flag.
//!
//! The seed ran bf16 mixed precision on GPUs; burn has no automatic mixed precision, so these profiles
//! keep fp32 (pure bf16 is `--precision bf16`).

use crate::config::{ConfigLayer, OptimizerKind};
use crate::schedule::ScheduleKind;

/// The profile names `--profile` accepts.
pub const PROFILES: [&str; 4] = ["pretrain", "sft", "sft-small", "sft-fast"];

/// The settings layer of a seed profile, or `None` for an unknown name.
pub fn profile(name: &str) -> Option<ConfigLayer> {
    let pretrain = ConfigLayer {
        model: Some("chatlm-mini".into()),
        batch: Some(16),
        accum: Some(8),
        seq: Some(256),
        tgt_seq: Some(256),
        optimizer: Some(OptimizerKind::Adafactor),
        // torch_optimizer.Adafactor(lr=...) keeps `relative_step=True`: the OneCycle rate is ignored.
        adafactor_relative_step: Some(true),
        schedule: Some(ScheduleKind::Onecycle),
        lr: Some(50.0 * 1e-4),
        div_factor: Some(50.0),
        pct_start: Some(0.3),
        final_div_factor: Some(1e4),
        max_grad_norm: Some(1.0),
        epochs: Some(8),
        save_steps: Some(10_000),
        keep: Some(8),
        seed: Some(23333),
        freeze: Some(Vec::new()),
        ..Default::default()
    };
    match name {
        "pretrain" => Some(pretrain),
        "sft" => Some(ConfigLayer {
            batch: Some(12),
            accum: Some(4),
            seq: Some(384 + 8),
            tgt_seq: Some(384 + 8),
            lr: Some(1e-5),
            // transformers' Trainer builds Adafactor with `relative_step=False`: the scheduled rate.
            adafactor_relative_step: Some(false),
            schedule: Some(ScheduleKind::Cosine),
            warmup_steps: Some(100),
            epochs: Some(4),
            save_steps: Some(5_000),
            keep: Some(3),
            ..pretrain
        }),
        "sft-small" => Some(ConfigLayer {
            freeze: Some(vec!["embeddings".into(), "encoder".into()]),
            ..pretrain
        }),
        "sft-fast" => Some(ConfigLayer {
            freeze: Some(vec!["embeddings".into(), "encoder".into()]),
            seq: Some(128),
            tgt_seq: Some(128),
            ..pretrain
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn every_profile_resolves_to_a_valid_config() {
        for name in PROFILES {
            let mut c = TrainConfig::default();
            profile(name).unwrap().apply(&mut c);
            c.validate().unwrap();
            assert_eq!(c.model, "chatlm-mini");
        }
        assert!(profile("nope").is_none());
    }

    #[test]
    fn pretrain_matches_the_seed_onecycle() {
        let mut c = TrainConfig::default();
        profile("pretrain").unwrap().apply(&mut c);
        // The seed's first step runs at learn_rate = 1e-4.
        assert!((c.schedule(1000).lr_at(0) - 1e-4).abs() < 1e-15);
        assert_eq!(c.batch * c.accum, 128);
    }
}
