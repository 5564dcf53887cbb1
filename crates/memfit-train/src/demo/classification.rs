//! The classification demo, behind `memfit train --demo classification`: short sentences of filler
//! words with at most one sentiment word, labelled positive, negative or neutral, where a "not"
//! right before the sentiment word flips it (a "not" elsewhere changes nothing). A bag of words
//! cannot solve it: the model has to look at word order. A word-level tokenizer with BERT's
//! `[CLS] … [SEP]` post-processor and a tiny BERT config are written beside the data.

use super::{DemoFiles, write_json, write_text};
use crate::batches::SplitMix64;
use crate::config::{BestMetric, ConfigLayer, TaskKind};
use crate::schedule::ScheduleKind;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// Specials in id order, BERT's names.
pub const SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const NOT: &str = "not";
const POSITIVE: [&str; 10] = [
    "good",
    "great",
    "fine",
    "happy",
    "lovely",
    "excellent",
    "nice",
    "pleasant",
    "superb",
    "wonderful",
];
const NEGATIVE: [&str; 10] = [
    "bad", "awful", "poor", "sad", "terrible", "horrible", "nasty", "dreadful", "grim", "ugly",
];
const FILLER: [&str; 24] = [
    "the", "a", "movie", "food", "day", "service", "was", "is", "it", "this", "really", "very",
    "quite", "so", "place", "show", "book", "trip", "room", "staff", "and", "our", "weather",
    "story",
];

/// Rows of the demo's training and validation sets.
pub const TRAIN_ROWS: usize = 3000;
pub const VALID_ROWS: usize = 300;

/// The demo's vocabulary in id order.
pub fn vocabulary() -> Vec<&'static str> {
    SPECIALS
        .iter()
        .copied()
        .chain([NOT])
        .chain(POSITIVE)
        .chain(NEGATIVE)
        .chain(FILLER)
        .collect()
}

fn pick<'a>(rng: &mut SplitMix64, words: &[&'a str]) -> &'a str {
    words[(rng.next_u64() % words.len() as u64) as usize]
}

/// One labelled sentence: 3–8 filler words, and (two times in three) one sentiment word at a random
/// place, preceded by "not" one time in four (else followed by one, a time in four); a neutral
/// sentence has a stray "not" one time in four.
pub fn row(rng: &mut SplitMix64) -> (String, &'static str) {
    let fillers = 3 + (rng.next_u64() % 6) as usize;
    let mut words: Vec<&str> = (0..fillers).map(|_| pick(rng, &FILLER)).collect();
    let kind = rng.next_u64() % 3;
    let label = if kind == 0 {
        if rng.next_u64().is_multiple_of(4) {
            let at = (rng.next_u64() % (words.len() as u64 + 1)) as usize;
            words.insert(at, NOT);
        }
        "neutral"
    } else {
        let positive = kind == 1;
        // one in four negated: the word alone is right three times in four, which a model
        // learns first; the rest needs the word before it
        let negated = rng.next_u64().is_multiple_of(4);
        let at = (rng.next_u64() % (words.len() as u64 + 1)) as usize;
        words.insert(at, pick(rng, if positive { &POSITIVE } else { &NEGATIVE }));
        if negated {
            words.insert(at, NOT);
        } else if rng.next_u64().is_multiple_of(4) {
            // a "not" after the word negates nothing: counting words cannot tell the labels
            words.insert(at + 1, NOT);
        }
        if positive != negated {
            "positive"
        } else {
            "negative"
        }
    };
    (words.join(" "), label)
}

/// `n` rows drawn from `seed`.
pub fn rows(n: usize, seed: u64) -> Vec<(String, &'static str)> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| row(&mut rng)).collect()
}

/// A Hugging Face `tokenizer.json`: WordLevel over whitespace-separated words, `[CLS] $A [SEP]`
/// (and `[CLS] $A [SEP] $B:1 [SEP]:1` for pairs) added by its post-processor, as BERT's tokenizers do.
pub fn tokenizer_json() -> Value {
    let vocab = vocabulary();
    let ids: BTreeMap<&str, usize> = vocab.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special = |name: &str, id: usize| json!({"id": name, "ids": [id], "tokens": [name]});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": special("[CLS]", 2), "[SEP]": special("[SEP]", 3)}
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": "[UNK]"}
    })
}

/// A tiny BERT in transformers' `config.json` form (its labels come from the data).
pub fn model_config(vocab_size: usize) -> Value {
    json!({
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0
    })
}

/// The demo's training settings over the defaults (which are the seq2seq demo's).
pub fn config_layer() -> ConfigLayer {
    ConfigLayer {
        task: Some(TaskKind::Classification),
        batch: Some(32),
        seq: Some(32),
        lr: Some(1e-3),
        schedule: Some(ScheduleKind::Onecycle),
        epochs: Some(30),
        best_metric: Some(BestMetric::Accuracy),
        // the summary's "before": an untrained classifier is at chance
        eval_at_start: Some(true),
        ..ConfigLayer::default()
    }
}

/// Writes `train.jsonl`, `valid.jsonl` (`{"text", "label"}` rows), `tokenizer/` and `config.json`
/// into `dir`. Deterministic: the same seed writes the same bytes.
pub fn write(dir: &Path, seed: u64) -> std::io::Result<DemoFiles> {
    let files = DemoFiles::in_dir(dir)?;
    let jsonl = |rows: Vec<(String, &str)>| -> String {
        rows.into_iter()
            .map(|(text, label)| format!("{}\n", json!({"text": text, "label": label})))
            .collect()
    };
    write_text(&files.train, jsonl(rows(TRAIN_ROWS, seed)))?;
    write_text(
        &files.valid,
        jsonl(rows(VALID_ROWS, seed ^ 0x0056_414c_4944)),
    )?;
    let tok = &files.tokenizer_dir;
    write_json(&tok.join("tokenizer.json"), tokenizer_json())?;
    let specials = json!({"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                          "sep_token": "[SEP]", "mask_token": "[MASK]"});
    write_json(&tok.join("special_tokens_map.json"), specials.clone())?;
    let mut config = specials;
    config["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    config["model_max_length"] = 64.into();
    write_json(&tok.join("tokenizer_config.json"), config)?;
    write_json(&files.model_config, model_config(vocabulary().len()))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_word_before_the_sentiment_word() {
        for (text, label) in rows(2000, 7) {
            let words: Vec<&str> = text.split(' ').collect();
            let sentiment = words
                .iter()
                .position(|w| POSITIVE.contains(w) || NEGATIVE.contains(w));
            let want = match sentiment {
                None => "neutral",
                Some(i) => {
                    let negated = i > 0 && words[i - 1] == NOT;
                    if POSITIVE.contains(&words[i]) != negated {
                        "positive"
                    } else {
                        "negative"
                    }
                }
            };
            assert_eq!(label, want, "{text}");
        }
        let all = rows(3000, 1);
        for class in ["positive", "negative", "neutral"] {
            let n = all.iter().filter(|(_, l)| *l == class).count();
            assert!((800..1200).contains(&n), "{class}: {n}");
        }
    }

    #[test]
    fn the_tokenizer_adds_cls_and_sep_and_knows_every_word() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(dir.path(), 3).unwrap();
        let tok = memfit_data::Tokenizer::load(&files.tokenizer_dir).unwrap();
        let encoding = tok.inner().encode("the food was not good", true).unwrap();
        let ids = encoding.get_ids();
        assert_eq!(ids.first(), Some(&2), "{ids:?}");
        assert_eq!(ids.last(), Some(&3), "{ids:?}");
        assert_eq!(ids.len(), 7);
        assert!(!ids.contains(&1), "no [UNK]: {ids:?}");
        assert_eq!(tok.pad().unwrap().id, 0);
    }
}
