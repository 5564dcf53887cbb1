//! Rows are bounded (issue 29): a 50 MB JSONL line ends `memfit data prepare`, `memfit train --data`
//! and `memfit tokenizer train` with a message naming the file, the line, its size and the limit,
//! exit 2, nothing written — and the process's own peak RSS (getrusage's maxrss of that child, via
//! wait4) stays below 500 MiB (it was 9 GiB). `memfit data prepare` runs under the memory guard.
//! The 1 GB line is a script (scripts/bench_row_limit.sh): too slow for the suite.

mod cli_data_common;

use cli_data_common::{memfit, stderr, stdout, trained_tokenizer};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

/// A run of the binary: exit code, stdout, stderr, and its peak RSS in bytes.
struct Measured {
    code: i32,
    stdout: String,
    stderr: String,
    peak_rss: u64,
}

/// Runs memfit and reaps it with wait4, whose rusage is that one child's (ru_maxrss: its VmHWM).
#[allow(clippy::zombie_processes)] // reaped by wait4, not Child::wait
fn measured(args: &[&str]) -> Measured {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).unwrap();
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let (mut status, mut usage) = (0i32, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: the pid is our unreaped child; status and usage are valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    Measured {
        code: if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        },
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        peak_rss: usage.ru_maxrss as u64 * 1024,
    }
}

/// prompt/response rows with a `size`-byte prompt on line 2.
fn with_long_line(dir: &Path, size: usize) -> PathBuf {
    let path = dir.join("big.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(
        f,
        r#"{{"prompt": "the quick brown fox", "response": "jumps"}}"#
    )
    .unwrap();
    write!(f, r#"{{"prompt": ""#).unwrap();
    let words = "lorem ipsum dolor sit amet ".repeat(1 << 12);
    let mut left = size;
    while left > 0 {
        let n = left.min(words.len());
        f.write_all(&words.as_bytes()[..n]).unwrap();
        left -= n;
    }
    writeln!(f, r#"", "response": "x"}}"#).unwrap();
    writeln!(f, r#"{{"prompt": "over the lazy dog", "response": "ok"}}"#).unwrap();
    path
}

/// No entry of `dir` but the `keep`-named ones.
fn only(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

fn assert_refused(m: &Measured, what: &str) {
    assert_eq!(m.code, 2, "{what}: {}", m.stderr);
    let line_bytes = (50 * MIB + 31).to_string(); // {"prompt": "…", "response": "x"}
    for part in [
        "big.jsonl",
        "line 2",
        &line_bytes,
        "row limit of 1048576 bytes",
    ] {
        assert!(
            m.stderr.contains(part),
            "{what}: no {part:?} in {}",
            m.stderr
        );
    }
    assert!(
        m.peak_rss < 500 * MIB,
        "{what}: peak RSS {} MiB",
        m.peak_rss / MIB
    );
}

#[test]
fn a_50_mb_line_is_refused_unread_by_prepare_train_and_tokenizer_under_500_mib() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = cli_data_common::corpus(d, 200);
    let tok = trained_tokenizer(d, &corpus);
    let big = with_long_line(d, 50 * MIB as usize);
    let (big_s, tok_s) = (big.to_str().unwrap(), tok.to_str().unwrap());
    let store = d.join("big.store");
    let store_s = store.to_str().unwrap();
    let before = only(d, &[]);

    let m = measured(&[
        "data",
        "prepare",
        "--input",
        big_s,
        "--tokenizer",
        tok_s,
        "--out",
        store_s,
    ]);
    assert_refused(&m, "data prepare");
    assert_eq!(only(d, &[]), before, "nothing written");

    let model = d.join("t5.json");
    std::fs::write(&model, r#"{"model_type": "t5", "vocab_size": 200, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}"#).unwrap();
    let run = d.join("run");
    let m = measured(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        big_s,
        "--tokenizer",
        tok_s,
        "--out",
        run.to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert_refused(&m, "train --data");
    assert!(!run.exists(), "no half-made run directory");

    let m = measured(&[
        "tokenizer",
        "train",
        "--input",
        big_s,
        "--vocab-size",
        "100",
        "--out",
        d.join("tok2").to_str().unwrap(),
    ]);
    assert_refused(&m, "tokenizer train");

    // --on-invalid skip leaves it out and goes on; a higher limit would take it whole.
    let m = measured(&[
        "data",
        "prepare",
        "--input",
        big_s,
        "--tokenizer",
        tok_s,
        "--out",
        store_s,
        "--on-invalid",
        "skip",
        "--json",
    ]);
    assert_eq!(m.code, 0, "{}", m.stderr);
    let meta: serde_json::Value = serde_json::from_str(&m.stdout).unwrap();
    assert_eq!(meta["rows"], 2);
    assert_eq!(meta["counts"]["skipped"], 1);
    assert_eq!(meta["options"]["max_row_bytes"], MIB);
    assert!(
        m.peak_rss < 500 * MIB,
        "skip: peak RSS {} MiB",
        m.peak_rss / MIB
    );
}

#[test]
fn the_row_limit_is_a_size_and_prepare_stops_at_the_guards_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = cli_data_common::corpus(d, 200);
    let tok = trained_tokenizer(d, &corpus);
    let (corpus_s, tok_s) = (corpus.to_str().unwrap(), tok.to_str().unwrap());
    let store = d.join("c.store");
    let prepare = |extra: &[&str]| {
        let mut args = vec![
            "data",
            "prepare",
            "--input",
            corpus_s,
            "--tokenizer",
            tok_s,
            "--out",
            store.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        memfit(&args)
    };
    // A row of the corpus is ~60 bytes: a 40-byte limit refuses line 1.
    let o = prepare(&["--max-row-bytes", "40B"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("line 1") && stderr(&o).contains("row limit of 40 bytes"));
    for bad in ["lots", "0"] {
        let o = prepare(&["--max-row-bytes", bad]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--max-row-bytes"), "{}", stderr(&o));
    }
    let o = prepare(&["--budget-ram", "lots"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The process alone is charged ~3 MiB, over 95% of 1 MiB: the guard stops it after a chunk.
    let o = prepare(&["--budget-ram", "1MiB"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("memory guard"), "{}", stderr(&o));
    assert!(!store.exists(), "nothing written");
    let o = prepare(&["--budget-ram", "2GiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("written"));
}

/// The guard is asked between chunks, so a row's tokenization is bounded up front: a row limit
/// whose tokenizing could pass the budget is lowered to what fits it, and a longer row is refused
/// unread (a 50 MB row under `--max-row-bytes 64MiB --budget-ram 2GiB` went past 6 GiB).
#[test]
fn a_row_whose_tokenizing_would_pass_the_budget_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = cli_data_common::corpus(d, 20);
    let tok = trained_tokenizer(d, &corpus);
    let long = d.join("long.jsonl");
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    let row = serde_json::json!({"prompt": "fox ".repeat(2 << 20), "response": "dog"});
    text += &format!("{row}\n");
    std::fs::write(&long, text).unwrap();
    let store = d.join("long.store");
    let prepare = |extra: &[&str]| {
        let mut args = vec!["data", "prepare", "--input", long.to_str().unwrap()];
        args.extend([
            "--tokenizer",
            tok.to_str().unwrap(),
            "--out",
            store.to_str().unwrap(),
        ]);
        args.extend(["--max-row-bytes", "64MiB", "--budget-ram", "1GiB"]);
        args.extend_from_slice(extra);
        memfit(&args)
    };
    // 8 MiB of text; 1 GiB allows 5.1 MiB rows at 192 B a byte.
    let o = prepare(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("lowered to 5.1 MiB") && err.contains("line 21"),
        "{err}"
    );
    assert!(!store.exists());
    let o = prepare(&["--on-invalid", "skip"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["rows"], 20, "the long row left out, the others kept");
}
