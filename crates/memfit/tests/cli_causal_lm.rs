//! `memfit train --task causal-lm` end to end on a tiny Llama the test writes itself (a word-level
//! tokenizer with a ChatML chat template, a reversal task as chat rows): full training from a
//! config, then LoRA from that model (`--init`), adapters as PEFT writes them, a stop and
//! `--resume` ending bit-identical, `memfit predict` with the adapter equal to `predict` on the
//! merged model `memfit export --merge` writes, and bad input named with exit 2.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

fn bad(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for w in words {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

const WORDS: [&str; 8] = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"];
const SPECIALS: [&str; 4] = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"];
const ROLES: [&str; 3] = ["user", "assistant", "system"];

/// A ChatML template (the shape of Qwen2.5's, without its tools branch).
const TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Writes the tokenizer, the model config and the data into `dir`.
struct Files {
    tokenizer: PathBuf,
    config: PathBuf,
    train: PathBuf,
    valid: PathBuf,
}

fn write_files(dir: &Path) -> Files {
    let tok = dir.join("tok");
    std::fs::create_dir_all(&tok).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> = SPECIALS
        .iter()
        .chain(&ROLES)
        .chain(&WORDS)
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, t)| serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(tok.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = serde_json::json!({"eos_token": "<|im_end|>", "pad_token": "<pad>",
        "unk_token": "<unk>", "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(tok.join("tokenizer_config.json"), config.to_string()).unwrap();
    let model = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": SPECIALS.len() + ROLES.len() + WORDS.len(), "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "eos_token_id": 2, "pad_token_id": 0
    });
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, model.to_string()).unwrap();
    let rows = |n: usize, seed: usize| -> String {
        (0..n)
            .map(|i| {
                let k = 2 + (i * 7 + seed) % 4;
                let words: Vec<&str> = (0..k).map(|j| WORDS[(i * 3 + j * 5 + seed) % 8]).collect();
                let reversed: Vec<&str> = words.iter().rev().copied().collect();
                format!(
                    "{}\n",
                    serde_json::json!({"instruction": words.join(" "), "output": reversed.join(" ")})
                )
            })
            .collect()
    };
    let (train, valid) = (dir.join("train.jsonl"), dir.join("valid.jsonl"));
    std::fs::write(&train, rows(96, 0)).unwrap();
    std::fs::write(&valid, rows(12, 1)).unwrap();
    Files {
        tokenizer: tok,
        config: config_path,
        train,
        valid,
    }
}

/// `memfit train` on the files, with `extra` flags.
fn train(f: &Files, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = memfit();
    cmd.args([
        "train",
        "--threads",
        "1",
        "--batch",
        "8",
        "--seq",
        "32",
        "--json",
    ])
    .arg("--data")
    .arg(&f.train)
    .arg("--valid")
    .arg(&f.valid)
    .arg("--tokenizer")
    .arg(&f.tokenizer)
    .arg("--out")
    .arg(out)
    .args(extra);
    cmd
}

fn predict(model: &Path, input: &Path) -> String {
    let out = memfit()
        .args(["predict", "--max-new-tokens", "6", "--model"])
        .arg(model)
        .arg("--input")
        .arg(input)
        .output()
        .unwrap();
    ok(&out);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn full_then_lora_resume_predict_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_files(dir.path());
    let full = dir.path().join("full");
    let config = f.config.display().to_string();
    let summary = ok(&train(
        &f,
        &full,
        &["--model", &config, "--max-steps", "24", "--lr", "1e-2"],
    )
    .output()
    .unwrap());
    assert_eq!(summary["task"], "causal-lm");
    assert!(summary["after"].as_f64().unwrap().is_finite(), "{summary}");
    let weights = std::fs::read(full.join("best/model.safetensors")).unwrap();
    let names = safetensors::SafeTensors::deserialize(&weights)
        .unwrap()
        .names()
        .len();
    assert_eq!(names, 1 + 2 * 9 + 2, "embed, 9 per layer, norm, lm_head");

    // LoRA on the trained model: the checkpoint is the adapter, as PEFT writes it.
    let base = full.join("best").display().to_string();
    let lora_args = [
        "--init",
        &base,
        "--method",
        "lora",
        "--lora-r",
        "4",
        "--max-steps",
        "12",
    ];
    let (lora, cut) = (dir.path().join("lora"), dir.path().join("cut"));
    ok(&train(&f, &lora, &lora_args).output().unwrap());
    let best = lora.join("best");
    let adapter: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(best.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (adapter["peft_type"].as_str(), adapter["r"].as_u64()),
        (Some("LORA"), Some(4))
    );
    let adapter_weights = std::fs::read(best.join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&adapter_weights).unwrap();
    assert!(
        st.names()
            .contains(&"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
        "{:?}",
        st.names()
    );
    assert!(
        !best.join("model.safetensors").exists(),
        "a LoRA checkpoint holds the adapter only"
    );

    // Stopped after its first step and resumed: the same adapter as the uninterrupted run.
    let mut child = train(&f, &cut, &lora_args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().starts_with("step 1/") {
            break;
        }
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    if child.wait().unwrap().code() == Some(75) {
        ok(&memfit()
            .args(["train", "--json", "--resume"])
            .arg(&cut)
            .output()
            .unwrap());
    }
    let last = |run: &Path| {
        std::fs::read(run.join("checkpoints/step-12/adapter_model.safetensors")).unwrap()
    };
    assert!(last(&lora) == last(&cut), "the resumed adapter differs");

    // predict with the adapter equals predict on the merged model export writes.
    let merged = dir.path().join("merged");
    ok(&memfit()
        .arg("export")
        .arg(&best)
        .arg("--merge")
        .arg("--out")
        .arg(&merged)
        .output()
        .unwrap());
    assert!(merged.join("model.safetensors").is_file() && merged.join("tokenizer.json").is_file());
    let with_adapter = predict(&best, &f.valid);
    assert_eq!(with_adapter.lines().count(), 12);
    assert_eq!(with_adapter, predict(&merged, &f.valid));

    // The same adapter pointed at another base: predict and export refuse it, naming what differs.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    for file in std::fs::read_dir(&best).unwrap() {
        let path = file.unwrap().path();
        std::fs::copy(&path, other.join(path.file_name().unwrap())).unwrap();
    }
    let qwen = Path::new(env!("CARGO_MANIFEST_DIR")).join("../memfit-nn/tests/fixtures/qwen2-tiny");
    let mut cfg = adapter.clone();
    cfg["base_model_name_or_path"] = qwen.display().to_string().into();
    std::fs::write(other.join("adapter_config.json"), cfg.to_string()).unwrap();
    let out = memfit()
        .args(["predict", "--model"])
        .arg(&other)
        .arg("--input")
        .arg(&f.valid)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = memfit()
        .arg("export")
        .arg(&other)
        .args(["--merge", "--out"])
        .arg(dir.path().join("merged-other"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("merged-other").exists());
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_files(dir.path());
    let config = f.config.display().to_string();
    let attempt = dir.path().join("attempt");
    // LoRA targets that match no module.
    let out = train(
        &f,
        &attempt,
        &[
            "--model",
            &config,
            "--method",
            "lora",
            "--lora-targets",
            "qq",
        ],
    )
    .output()
    .unwrap();
    bad(&out, &["qq"]);
    assert!(!attempt.exists());
    // A chat row without a response.
    let no_response = dir.path().join("no_response.jsonl");
    std::fs::write(
        &no_response,
        "{\"instruction\": \"red cat\", \"output\": \"\"}\n",
    )
    .unwrap();
    let out = memfit()
        .args(["train", "--model", &config, "--tokenizer"])
        .arg(&f.tokenizer)
        .arg("--data")
        .arg(&no_response)
        .arg("--out")
        .arg(&attempt)
        .output()
        .unwrap();
    bad(&out, &["no_response.jsonl", "output"]);
    assert!(!attempt.exists());
    // A mixture-of-experts config.
    let moe = dir.path().join("moe.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&f.config).unwrap()).unwrap();
    m["num_local_experts"] = 4.into();
    std::fs::write(&moe, m.to_string()).unwrap();
    let out = train(&f, &attempt, &["--model", moe.to_str().unwrap()])
        .output()
        .unwrap();
    bad(&out, &["num_local_experts"]);
    // --method lora on a task without adapters.
    let out = memfit()
        .args([
            "train",
            "--demo",
            "classification",
            "--method",
            "lora",
            "--out",
        ])
        .arg(&attempt)
        .output()
        .unwrap();
    bad(&out, &["method", "lora"]);
}
