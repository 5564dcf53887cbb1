//! `memfit train --init`: the ChatLM flow on the demo's tiny T5 — pretrain, then SFT from the pretrained
//! checkpoint with the embeddings and encoder frozen — and the refusals of a bad `--init`.

use std::path::Path;
use std::process::{Command, Output};

fn memfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .output()
        .unwrap()
}

/// `--data/--valid/--tokenizer` of the demo task a pretraining run `pre` wrote (a run from --init
/// names a model, and only the demo's own model brings its data).
fn demo_data(pre: &Path) -> Vec<String> {
    let demo = pre.join("demo");
    [
        ("--data", "train.jsonl"),
        ("--valid", "valid.jsonl"),
        ("--tokenizer", "tokenizer"),
    ]
    .iter()
    .flat_map(|(flag, name)| [flag.to_string(), demo.join(name).display().to_string()])
    .collect()
}

fn train(out: &Path, steps: &str, extra: &[&str]) -> Output {
    let out = out.display().to_string();
    let mut args = vec![
        "train",
        "--out",
        &out,
        "--max-steps",
        steps,
        "--threads",
        "1",
        "--eval-rows",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    memfit(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// name → raw bytes of every tensor in a safetensors file.
fn tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| (name, t.data().to_vec()))
        .collect()
}

fn newest_checkpoint(run: &Path) -> std::path::PathBuf {
    let mut steps: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    steps.sort_by_key(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.trim_start_matches("step-").parse::<u64>().unwrap_or(0)
    });
    steps.pop().expect("a step checkpoint")
}

#[test]
fn sft_from_the_pretrained_checkpoint_keeps_frozen_weights_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (pre, sft) = (dir.path().join("pre"), dir.path().join("sft"));
    let o = train(&pre, "3", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let init = newest_checkpoint(&pre);
    let init_s = init.display().to_string();

    let data = demo_data(&pre);
    let mut args = vec!["--init", &init_s, "--freeze", "embeddings,encoder"];
    args.extend(data.iter().map(String::as_str));
    let o = train(&sft, "3", &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("init: weights from"), "{}", stderr(&o));
    let config = std::fs::read_to_string(sft.join("config.toml")).unwrap();
    assert!(config.contains(&format!("init = {init_s:?}")), "{config}");

    let before = tensors(&init.join("model.safetensors"));
    let after = tensors(&newest_checkpoint(&sft).join("model.safetensors"));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    let frozen = |n: &str| n.starts_with("shared.") || n.starts_with("encoder.");
    let (mut same, mut changed) = (0, 0);
    for (name, bytes) in &before {
        if frozen(name) {
            assert_eq!(bytes, &after[name], "frozen {name} changed");
            same += 1;
        } else if bytes != &after[name] {
            changed += 1;
        }
    }
    assert!(same > 0, "no frozen tensor compared");
    assert!(changed > 0, "SFT trained none of the decoder's weights");
}

#[test]
fn sft_starts_from_the_init_weights_not_random_ones() {
    // A run from --init with no step taken sees the pretrained loss, not a random model's.
    let dir = tempfile::tempdir().unwrap();
    let (pre, sft) = (dir.path().join("pre"), dir.path().join("sft"));
    let o = train(&pre, "20", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let pre_summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let init = newest_checkpoint(&pre).display().to_string();
    let data = demo_data(&pre);
    let mut args = vec!["--init", &init];
    args.extend(data.iter().map(String::as_str));
    let o = train(&sft, "1", &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let sft_summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (first_pre, first_sft) = (
        pre_summary["loss_first"].as_f64().unwrap(),
        sft_summary["loss_first"].as_f64().unwrap(),
    );
    assert!(
        first_sft < 0.8 * first_pre,
        "SFT's first loss {first_sft} is not below the random start's {first_pre}"
    );
}

#[test]
fn a_bad_init_directory_exits_2_naming_it_and_leaves_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let pre = dir.path().join("pre");
    let o = train(&pre, "1", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = newest_checkpoint(&pre);

    // No weights at all.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::copy(ckpt.join("config.json"), empty.join("config.json")).unwrap();
    // A truncated safetensors file.
    let cut = dir.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    std::fs::copy(ckpt.join("config.json"), cut.join("config.json")).unwrap();
    let bytes = std::fs::read(ckpt.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    // A pytorch_model.bin that is not a checkpoint (no safetensors beside it, so it is read).
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(ckpt.join("config.json"), bin.join("config.json")).unwrap();
    std::fs::write(bin.join("pytorch_model.bin"), &bytes[..4096]).unwrap();
    // Another architecture than --model.
    for (init, model, needle) in [
        (&empty, None, "no model.safetensors"),
        (&cut, None, "truncated"),
        (
            &bin,
            None,
            "bin/pytorch_model.bin: not a PyTorch checkpoint",
        ),
        (&ckpt, Some("t5-small"), "another model"),
    ] {
        let run = dir
            .path()
            .join(format!("run-{}", needle.replace([' ', '/', ':'], "-")));
        let init_s = init.display().to_string();
        let data = demo_data(&pre);
        let mut extra = vec!["--init", init_s.as_str()];
        extra.extend(data.iter().map(String::as_str));
        if let Some(m) = model {
            extra.extend(["--model", m]);
        }
        let o = train(&run, "1", &extra);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
        assert!(
            !run.join("config.toml").exists() && !run.join("checkpoints").exists(),
            "{} looks like a run",
            run.display()
        );
    }
}

#[test]
fn an_unknown_model_is_named_with_the_presets() {
    for extra in [&[][..], &["--data", "rows.jsonl"][..]] {
        let mut args = vec!["train", "--model", "no-such-model"];
        args.extend_from_slice(extra);
        let o = memfit(&args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("no-such-model")
                && err.contains("t5-small")
                && err.contains("chatlm-mini"),
            "{err}"
        );
    }
}
