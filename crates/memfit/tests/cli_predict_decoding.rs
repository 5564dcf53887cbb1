//! `memfit predict` decodes as it says: plain greedy by default (transformers'
//! `generate(do_sample=False)`: no penalty, repeats allowed), the seed's decoding (no repeated
//! 4-gram, repetition penalty 1.3) only with `--decoding seed`.

use std::path::Path;
use std::process::Command;

fn memfit(args: &[&str], paths: &[&Path]) -> std::process::Output {
    let o = Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .args(paths)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// The generated texts, one per row.
fn texts(out: &[u8]) -> Vec<Vec<char>> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["text"].as_str().unwrap().chars().collect()
        })
        .collect()
}

fn repeats_a_4gram(t: &[char]) -> bool {
    let grams: Vec<&[char]> = t.windows(4).collect();
    grams
        .iter()
        .enumerate()
        .any(|(i, g)| grams[i + 1..].contains(g))
}

#[test]
fn greedy_by_default_the_seed_s_decoding_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // a few steps of the seq2seq demo: a model that still repeats itself
    let o = memfit(
        &[
            "train",
            "--max-steps",
            "30",
            "--threads",
            "1",
            "--json",
            "--out",
        ],
        &[&run],
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ckpt = Path::new(summary["last_checkpoint"].as_str().unwrap()).to_path_buf();
    let input = run.join("demo/valid.jsonl");
    let predict = |extra: &[&str]| {
        let mut args = vec!["predict", "--max-new-tokens", "24"];
        args.extend_from_slice(extra);
        let o = memfit(&args, &[]);
        texts(&o.stdout)
    };
    let model = ckpt.display().to_string();
    let input = input.display().to_string();
    let greedy = predict(&["--model", &model, "--input", &input]);
    let seed = predict(&["--model", &model, "--input", &input, "--decoding", "seed"]);
    assert_eq!(greedy.len(), 200);
    assert!(
        seed.iter().all(|t| !repeats_a_4gram(t)),
        "the seed's decoding bans repeated 4-grams"
    );
    // plain greedy allows what the seed's decoding bans: some row repeats a 4-gram
    assert!(greedy.iter().any(|t| repeats_a_4gram(t)), "{greedy:?}");
    assert_ne!(greedy, seed);
}
