//! The seq2seq demo, behind `memfit train` with no arguments: Arabic numbers → Chinese numerals
//! ("12045" → "一万二千零四十五"), deterministic from a seed, with a character-level tokenizer written
//! as a real Hugging Face `tokenizer.json` (so checkpoints carry loadable tokenizer files) and a tiny
//! T5 `config.json`.

use super::{DemoFiles, write_json, write_text};
use crate::batches::SplitMix64;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// The specials every memfit tokenizer starts with, in id order (the ChatLM tokenizer's layout).
pub const SPECIALS: [&str; 7] = [
    "[PAD]", "[EOS]", "[SEP]", "[BOS]", "[CLS]", "[MASK]", "[UNK]",
];
const DIGITS: [char; 10] = ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'];
const NUMERALS: [char; 10] = ['零', '一', '二', '三', '四', '五', '六', '七', '八', '九'];
const UNITS: [char; 4] = ['十', '百', '千', '万'];

/// Largest number the task uses (five digits: up to 万).
pub const MAX_NUMBER: u32 = 99_999;

/// Chinese numeral of `n` (0..=99,999) in the standard reading: zeros inside a number collapse to
/// one 零, trailing zeros are silent, and a leading 一十 is read 十 (十五, but 一百一十).
pub fn chinese_numeral(n: u32) -> String {
    assert!(n <= MAX_NUMBER, "demo numbers stop at {MAX_NUMBER}");
    if n == 0 {
        return NUMERALS[0].to_string();
    }
    let high = n / 10_000;
    let low = n % 10_000;
    let mut out = String::new();
    if high > 0 {
        out.push(NUMERALS[high as usize]);
        out.push(UNITS[3]);
        if low == 0 {
            return out;
        }
        if low < 1000 {
            out.push(NUMERALS[0]);
        }
        out.push_str(&below_ten_thousand(low, false));
    } else {
        out.push_str(&below_ten_thousand(low, true));
    }
    out
}

/// 1..=9999; `leading` allows the bare 十 of 10–19.
fn below_ten_thousand(n: u32, leading: bool) -> String {
    let digits = [n / 1000, n / 100 % 10, n / 10 % 10, n % 10];
    let units = [Some(UNITS[2]), Some(UNITS[1]), Some(UNITS[0]), None];
    let mut out = String::new();
    let mut pending_zero = false;
    for (i, (&d, unit)) in digits.iter().zip(units).enumerate() {
        if d == 0 {
            pending_zero = !out.is_empty();
            continue;
        }
        if pending_zero {
            out.push(NUMERALS[0]);
            pending_zero = false;
        }
        let bare_ten = leading && i == 2 && d == 1 && out.is_empty();
        if !bare_ten {
            out.push(NUMERALS[d as usize]);
        }
        if let Some(u) = unit {
            out.push(u);
        }
    }
    out
}

/// `rows` (number, numeral) pairs: the digit count is uniform over 1..=5, then the number is uniform
/// among numbers of that many digits, so short and long numbers are equally common.
pub fn pairs(rows: usize, seed: u64) -> Vec<(String, String)> {
    let mut rng = SplitMix64::new(seed);
    (0..rows)
        .map(|_| {
            let digits = 1 + rng.below(5) as u32;
            let lo = if digits == 1 {
                0
            } else {
                10u32.pow(digits - 1)
            };
            let hi = 10u32.pow(digits) - 1;
            let n = lo + rng.below(u64::from(hi - lo + 1)) as u32;
            (n.to_string(), chinese_numeral(n))
        })
        .collect()
}

/// The tokenizer's vocabulary: specials, then digits, then numerals and units.
pub fn vocabulary() -> Vec<String> {
    SPECIALS
        .iter()
        .map(|s| s.to_string())
        .chain(DIGITS.iter().map(char::to_string))
        .chain(NUMERALS.iter().map(char::to_string))
        .chain(UNITS.iter().map(char::to_string))
        .collect()
}

/// A Hugging Face `tokenizer.json`: WordLevel over single characters (a `Split` pre-tokenizer that
/// isolates every character), specials as added tokens, a `Fuse` decoder (no spaces between characters).
pub fn tokenizer_json() -> Value {
    let vocab = vocabulary();
    let ids: BTreeMap<&str, usize> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": "[UNK]"}
    })
}

/// A tiny T5 (v1.0: ReLU feed-forward, tied embeddings) in transformers' `config.json` form, sized so
/// that it learns the task in about two minutes on 2 cores.
pub fn model_config(vocab_size: usize) -> Value {
    json!({
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": vocab_size,
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 256,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        // T5's defaults (transformers T5Config).
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "dropout_rate": 0.1,
        "layer_norm_epsilon": 1e-6,
        "initializer_factor": 1.0,
        "feed_forward_proj": "relu",
        "is_encoder_decoder": true,
        "tie_word_embeddings": true,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0
    })
}

/// Rows of the demo's training and validation sets.
pub const TRAIN_ROWS: usize = 4000;
pub const VALID_ROWS: usize = 200;

/// Writes `train.jsonl`, `valid.jsonl` (`{"prompt", "response"}` rows), `tokenizer/` and
/// `config.json` into `dir`. Deterministic: the same seed writes the same bytes. Validation rows use
/// their own stream, so they are mostly unseen numbers.
pub fn write(dir: &Path, seed: u64) -> std::io::Result<DemoFiles> {
    let files = DemoFiles::in_dir(dir)?;
    let jsonl = |rows: Vec<(String, String)>| -> String {
        rows.into_iter()
            .map(|(p, r)| format!("{}\n", json!({"prompt": p, "response": r})))
            .collect()
    };
    write_text(&files.train, jsonl(pairs(TRAIN_ROWS, seed)))?;
    write_text(
        &files.valid,
        jsonl(pairs(VALID_ROWS, seed ^ 0x0056_414c_4944)),
    )?;
    let tok = &files.tokenizer_dir;
    write_json(&tok.join("tokenizer.json"), tokenizer_json())?;
    let specials = json!({"eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"});
    write_json(&tok.join("special_tokens_map.json"), specials.clone())?;
    let mut config = specials;
    config["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    write_json(&tok.join("tokenizer_config.json"), config)?;
    write_json(&files.model_config, model_config(vocabulary().len()))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numerals_follow_the_standard_reading() {
        let cases = [
            (0, "零"),
            (7, "七"),
            (10, "十"),
            (15, "十五"),
            (20, "二十"),
            (101, "一百零一"),
            (110, "一百一十"),
            (1001, "一千零一"),
            (1010, "一千零一十"),
            (1100, "一千一百"),
            (10000, "一万"),
            (10010, "一万零一十"),
            (10100, "一万零一百"),
            (12045, "一万二千零四十五"),
            (20001, "二万零一"),
            (99999, "九万九千九百九十九"),
            (50600, "五万零六百"),
        ];
        for (n, want) in cases {
            assert_eq!(chinese_numeral(n), want, "{n}");
        }
    }

    #[test]
    fn pairs_are_deterministic_and_cover_every_length() {
        let a = pairs(500, 1);
        assert_eq!(a, pairs(500, 1));
        assert_ne!(a, pairs(500, 2));
        for len in 1..=5 {
            assert!(a.iter().any(|(p, _)| p.len() == len));
        }
    }

    #[test]
    fn tokenizer_json_loads_in_hf_tokenizers_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(dir.path(), 3).unwrap();
        let tok = memfit_data::Tokenizer::load(&files.tokenizer_dir).unwrap();
        assert_eq!(tok.vocab_size(), 31);
        assert_eq!((tok.pad().unwrap().id, tok.eos().unwrap().id), (0, 1));
        let ids = tok.encode("一万零一十").unwrap();
        assert_eq!(ids.len(), 5);
        assert!(ids.iter().all(|&i| i >= 7), "no [UNK]: {ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), "一万零一十");
        let digits = tok.encode("90210").unwrap();
        assert_eq!(digits, vec![7 + 9, 7, 7 + 2, 7 + 1, 7]);
        // The special ids match the ChatLM layout.
        assert_eq!(tok.inner().token_to_id("[UNK]"), Some(6));
    }

    #[test]
    fn files_are_byte_identical_for_the_same_seed() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(a.path(), 9).unwrap();
        write(b.path(), 9).unwrap();
        for f in [
            "train.jsonl",
            "valid.jsonl",
            "config.json",
            "tokenizer/tokenizer.json",
        ] {
            assert_eq!(
                std::fs::read(a.path().join(f)).unwrap(),
                std::fs::read(b.path().join(f)).unwrap()
            );
        }
    }
}
