//! `memfit train` end to end on the demo task (tiny T5, seconds): exact resume after SIGKILL, the
//! run directory's files, bad input → exit 2, and `memfit report`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

/// A short demo run: fixed seed and threads, a checkpoint every step.
fn demo_args(out: &Path, steps: u64) -> Vec<String> {
    [
        "train",
        "--out",
        &out.display().to_string(),
        "--max-steps",
        &steps.to_string(),
        "--save-steps",
        "1",
        "--keep",
        "2",
        "--threads",
        "1",
        "--eval-rows",
        "4",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Every tensor of a safetensors file: (name, dtype, shape, bytes), sorted by name.
fn tensors(bytes: &[u8]) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            (
                name,
                format!("{:?}", t.dtype()),
                t.shape().to_vec(),
                t.data().to_vec(),
            )
        })
        .collect();
    v.sort();
    v
}

fn metric_lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

#[test]
fn sigkill_at_a_random_step_then_resume_is_bit_identical() {
    const STEPS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));

    let out = memfit().args(demo_args(&a, STEPS)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["steps"], STEPS);

    // A "random" step in 2..=9 from the clock (the test must not depend on one lucky value).
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let kill_after = 2 + clock % 8;
    let mut child = memfit()
        .args(demo_args(&b, STEPS))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric_lines(&b) < kill_after && Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap_or(()); // SIGKILL
    child.wait().unwrap();
    let killed_at = metric_lines(&b);
    assert!(
        killed_at < STEPS as usize,
        "the run finished before it could be killed"
    );

    let out = memfit()
        .args(["train", "--resume", &b.display().to_string(), "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Tensors and metadata compared by name: the header's key order is not part of the contract.
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let wa = std::fs::read(a.join(format!("checkpoints/step-{STEPS}/{file}"))).unwrap();
        let wb = std::fs::read(b.join(format!("checkpoints/step-{STEPS}/{file}"))).unwrap();
        assert_eq!(
            tensors(&wa),
            tensors(&wb),
            "{file} differs after a SIGKILL at step {killed_at} and resume"
        );
        let meta = |bytes: &[u8]| {
            let (_, m) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
            let mut kv: Vec<(String, String)> = m
                .metadata()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            kv.sort();
            kv
        };
        assert_eq!(meta(&wa), meta(&wb), "{file} metadata differs");
    }
    // The resumed run's metrics read as one run: steps 1..=12 once each, same losses.
    let read = |p: &Path| -> Vec<(u64, f64)> {
        std::fs::read_to_string(p.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())
            })
            .collect()
    };
    assert_eq!(read(&a), read(&b));
}

#[test]
fn a_run_directory_holds_every_file_of_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = memfit().args(demo_args(&run, 3)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("trainable / total parameters"), "{stderr}");
    for f in [
        "config.toml",
        "plan.json",
        "metrics.jsonl",
        "events.jsonl",
        "train.log",
        "best/trainer_state.json",
    ] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let ckpt = run.join("checkpoints/step-3");
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        assert!(ckpt.join(f).is_file(), "checkpoint lacks {f}");
    }
    // Retention: --keep 2.
    assert!(!run.join("checkpoints/step-1").exists());
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("plan.json")).unwrap()).unwrap();
    assert!(plan["host"]["peak_rss_bytes"].as_u64().unwrap() > 0);

    checkpoint_tokenizer_encodes_as_the_store_holds(&run, &ckpt);
    report_draws_the_run_against_its_budget(&run);
}

/// transformers' AutoTokenizer encodes with the checkpoint's tokenizer.json and special tokens on: the
/// ids must be those training read (the store's rows, EOS included).
fn checkpoint_tokenizer_encodes_as_the_store_holds(run: &Path, ckpt: &Path) {
    let tok = memfit_data::Tokenizer::load(ckpt).unwrap();
    let store = memfit_data::TokenStore::open(&run.join("data/train.store")).unwrap();
    let rows = std::fs::read_to_string(run.join("demo/train.jsonl")).unwrap();
    let mut buf = memfit_data::RowBuf::default();
    for (i, line) in rows.lines().enumerate().take(200) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let row = store.read_row(i, &mut buf).unwrap();
        let ids = |key: &str| -> Vec<u32> {
            let text = v[key].as_str().unwrap();
            tok.inner().encode(text, true).unwrap().get_ids().to_vec()
        };
        assert_eq!(ids("prompt"), row.source().to_vec(), "row {i}: {line}");
        assert_eq!(ids("response"), row.target().unwrap().to_vec(), "row {i}");
    }
}

/// `memfit report`: memory from zero up past the budget, a legend entry per line, and a PNG of the
/// stated size.
fn report_draws_the_run_against_its_budget(run: &Path) {
    let out = memfit()
        .args(["report", &run.display().to_string(), "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let budget = report["budget_bytes"]
        .as_f64()
        .expect("the run has a budget");
    let memory = &report["panels"][2];
    let unit = match memory["unit"].as_str().unwrap() {
        "MiB" => (1u64 << 20) as f64,
        _ => (1u64 << 30) as f64,
    };
    assert_eq!(memory["y_range"][0], 0.0, "memory from zero");
    assert!(memory["y_range"][1].as_f64().unwrap() * unit >= budget);
    let labels: Vec<&str> = memory["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert!(labels[0].starts_with("budget ") && labels[1..] == ["peak RSS", "RSS"]);
    report_draws_the_evaluations(run, &report);
    let svg = std::fs::read_to_string(run.join("report.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("polyline"));
    for text in [
        "peak RSS",
        "optimizer step",
        "learning rate",
        "validation loss",
        "BLEU-4 (standard)",
    ] {
        assert!(svg.contains(text), "the SVG shows {text:?}");
    }
    let png = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(run.join("report.png")).unwrap(),
    ));
    let info = png.read_info().unwrap().info().clone();
    assert_eq!(
        (info.width as u64, info.height as u64),
        (
            report["width"].as_u64().unwrap(),
            report["height"].as_u64().unwrap()
        )
    );
}

/// The validation loss beside the training loss and the BLEU scores, each with the values of the
/// run's `eval` events.
fn report_draws_the_evaluations(run: &Path, report: &serde_json::Value) {
    let evals: Vec<serde_json::Value> = std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["kind"] == "eval")
        .collect();
    assert!(!evals.is_empty(), "the demo run evaluates");
    let panels = report["panels"].as_array().unwrap();
    let series = |key: &str| {
        panels
            .iter()
            .flat_map(|p| p["series"].as_array().unwrap())
            .find(|s| s["key"] == key)
            .unwrap_or_else(|| panic!("no {key} series"))
            .clone()
    };
    assert_eq!(panels[0]["series"][1]["key"], "valid_loss");
    for (key, field) in [
        ("valid_loss", "valid_loss"),
        ("bleu4", "bleu4"),
        ("bleu4_standard", "bleu4_standard"),
    ] {
        let s = series(key);
        assert_eq!(s["points"].as_u64().unwrap() as usize, evals.len(), "{key}");
        assert_eq!(s["first"], evals[0][field], "{key}");
        assert_eq!(s["last"], evals[evals.len() - 1][field], "{key}");
    }
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let expect_2 = |args: &[&str], needle: &str| {
        let out = memfit().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    let missing = dir.path().join("missing");
    expect_2(
        &["train", "--resume", missing.to_str().unwrap()],
        "not a run directory",
    );
    expect_2(
        &[
            "train",
            "--out",
            "/proc/memfit-cannot-write",
            "--max-steps",
            "1",
        ],
        "--out /proc/memfit-cannot-write",
    );
    expect_2(&["train", "--profile", "nope"], "known profiles");
    expect_2(&["train", "--batch", "0"], "batch");
    let decayed = dir.path().join("decayed");
    expect_2(
        &[
            "train",
            "--out",
            decayed.to_str().unwrap(),
            "--weight-decay",
            "-0.1",
        ],
        "weight_decay",
    );
    assert!(!decayed.exists(), "a refused run leaves nothing behind");
    // A named model with no data is refused, not trained on the demo's data.
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "t5", "vocab_size": 10, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}"#).unwrap();
    let run = dir.path().join("vocab");
    let (run_s, cfg_s) = (run.to_str().unwrap(), cfg.to_str().unwrap());
    expect_2(
        &["train", "--out", run_s, "--model", cfg_s],
        "needs training data",
    );
    assert!(!run.exists(), "a refused run leaves nothing behind");

    let ok = dir.path().join("ok");
    let out = memfit().args(demo_args(&ok, 2)).output().unwrap();
    assert!(out.status.success());
    // A model whose vocabulary is smaller than the tokenizer's (the demo's files as data).
    let (data, tok) = (ok.join("demo/train.jsonl"), ok.join("demo/tokenizer"));
    let (data, tok) = (data.to_str().unwrap(), tok.to_str().unwrap());
    expect_2(
        &[
            "train",
            "--out",
            run_s,
            "--model",
            cfg_s,
            "--data",
            data,
            "--tokenizer",
            tok,
        ],
        "vocab_size 10",
    );
    assert!(
        !run.join("config.toml").exists(),
        "a refused run leaves no run behind"
    );
    // A resume that changes the trajectory is refused and names the change.
    expect_2(
        &["train", "--resume", ok.to_str().unwrap(), "--lr", "0.5"],
        "--allow-config-change",
    );
    // A second run into the same directory is refused.
    expect_2(
        &["train", "--out", ok.to_str().unwrap()],
        "already holds a run",
    );
}

/// A one-step demo run in `dir/demo-run`: the data, tokenizer and `best/` the tests below use.
fn demo_run(dir: &Path) -> std::path::PathBuf {
    let demo = dir.join("demo-run");
    let o = memfit().args(demo_args(&demo, 1)).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    demo
}

/// One step of `train` from `data` with the demo's tokenizer into `out`, `extra` flags added:
/// everything it printed, after it succeeded.
fn one_step(demo: &Path, data: &Path, extra: &[&str], out: &Path) -> String {
    let o = memfit()
        .args(["train", "--max-steps", "1", "--threads", "1"])
        .args(extra)
        .arg("--data")
        .arg(data)
        .arg("--tokenizer")
        .arg(demo.join("demo/tokenizer"))
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{all}");
    all
}

/// Rows cut when a store was prepared are not brought back by a longer `--seq`: the warning says to
/// prepare the store again; rows this run cut at its own `--seq`, to raise it.
#[test]
fn the_truncation_warning_names_what_keeps_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let demo = demo_run(dir.path());
    let (data, tok) = (demo.join("demo/train.jsonl"), demo.join("demo/tokenizer"));
    let store = dir.path().join("cut.store");
    let prepared = memfit()
        .args(["data", "prepare", "--task", "seq2seq"])
        .args(["--max-len", "3", "--max-target-len", "3"])
        .arg("--input")
        .arg(&data)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--out")
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        prepared.status.success(),
        "{}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let best = demo.join("best");
    let init = ["--init", best.to_str().unwrap(), "--eval-rows", "2"];
    let given = one_step(&demo, &store, &init, &dir.path().join("from-store"));
    assert!(
        given.contains("prepared at --max-len 3 / 3") && given.contains("memfit data prepare"),
        "{given}"
    );
    let own_seq = [&init[..], &["--seq", "8", "--tgt-seq", "8"]].concat();
    let own = one_step(&demo, &data, &own_seq, &dir.path().join("from-jsonl"));
    assert!(
        own.contains("a longer --seq / --tgt-seq keeps them") && !own.contains("data prepare"),
        "{own}"
    );
}

/// A model trained from scratch on the task's fine-tuning defaults is told so, with the profile
/// that pretrains; with `--init` or a profile, nothing is said.
#[test]
fn a_model_from_scratch_hears_of_the_pretrain_profile() {
    let dir = tempfile::tempdir().unwrap();
    let demo = demo_run(dir.path());
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "t5", "vocab_size": 64, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}"#).unwrap();
    let data = demo.join("demo/train.jsonl");
    let start_line =
        |extra: &[&str], out: &str| one_step(&demo, &data, extra, &dir.path().join(out));
    let cfg = cfg.to_str().unwrap();
    let note = "--profile pretrain takes the seed's pretraining settings";
    assert!(start_line(&["--model", cfg], "scratch").contains(note));
    let profiled = start_line(&["--model", cfg, "--profile", "pretrain"], "profiled");
    assert!(!profiled.contains(note), "{profiled}");
    let init = demo.join("best");
    let tuned = start_line(&["--init", init.to_str().unwrap()], "tuned");
    assert!(!tuned.contains(note), "{tuned}");
}
