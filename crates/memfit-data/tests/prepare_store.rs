//! `prepare` → `TokenStore` on data the tests generate: contents, truncation, policies, bad input,
//! idempotence, atomicity, padding.

mod common;

use common::{EOS, PAD, ids, row, words};
use memfit_data::prepare::{InvalidPolicy, PrepareOptions, PrepareReport, prepare};
use memfit_data::{Batching, DataError, Location, Sampler, SamplerConfig, Task, TokenStore};
use std::path::{Path, PathBuf};

fn run(opts: &PrepareOptions) -> Result<PrepareReport, DataError> {
    prepare(opts, &mut |_| {})
}

fn opts(dir: &Path, input: PathBuf, task: Task) -> PrepareOptions {
    PrepareOptions::new(
        vec![input],
        common::tokenizer(dir),
        task,
        dir.join("out.store"),
    )
}

fn with_eos(mut v: Vec<u32>) -> Vec<u32> {
    v.push(EOS);
    v
}

#[test]
fn seq2seq_jsonl_rows_are_ids_plus_eos() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 500);
    let report = run(&opts(tmp.path(), input, Task::Seq2seq)).unwrap();
    assert!(!report.reused);
    let store = TokenStore::open(&report.store).unwrap();
    assert_eq!(store.len(), 500);
    assert_eq!(store.meta().token_width, 2);
    assert_eq!((store.eos_id(), store.pad_id()), (Some(EOS), Some(PAD)));
    for i in [0, 1, 7, 250, 499] {
        let (s, t) = common::seq2seq_row(i);
        let r = row(&store, i);
        assert_eq!(r.source().to_vec(), with_eos(ids(&s)), "row {i}");
        assert_eq!(r.target().unwrap().to_vec(), with_eos(ids(&t)), "row {i}");
    }
    assert!(
        store
            .read_row(500, &mut memfit_data::RowBuf::default())
            .is_err()
    );
    let m = store.meta();
    assert_eq!(
        (m.counts.read, m.counts.written, m.counts.truncated),
        (500, 500, 0)
    );
    // Prompt lengths 1..=7 words + EOS: min 2, max 8, all in the first (≤ 8) bucket.
    assert_eq!((m.lengths[0].min, m.lengths[0].max), (2, 8));
    assert_eq!(m.lengths[0].histogram[0].rows, 500);
    assert_eq!(m.sources[0].sha256.len(), 64);
    assert_eq!(common::hidden_entries(tmp.path()), Vec::<String>::new());
}

#[test]
fn parquet_with_many_row_groups_gives_the_same_store_as_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let pq = common::seq2seq_parquet(&tmp.path().join("d.parquet"), 1000, 64);
    let jl = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 1000);
    let mut a = opts(tmp.path(), pq, Task::Seq2seq);
    a.chunk_rows = 100;
    let mut b = opts(tmp.path(), jl, Task::Seq2seq);
    b.out = tmp.path().join("jsonl.store");
    let (sa, sb) = (run(&a).unwrap(), run(&b).unwrap());
    let (sa, sb) = (
        TokenStore::open(&sa.store).unwrap(),
        TokenStore::open(&sb.store).unwrap(),
    );
    assert_eq!(sa.len(), 1000);
    for i in 0..1000 {
        assert_eq!(row(&sa, i).source().to_vec(), row(&sb, i).source().to_vec());
        assert_eq!(
            row(&sa, i).target().unwrap().to_vec(),
            row(&sb, i).target().unwrap().to_vec()
        );
    }
    assert_eq!(sa.row_lengths().unwrap(), sb.row_lengths().unwrap());
}

#[test]
fn truncation_counts_tokens_and_keeps_eos_last() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::write_jsonl(
        &tmp.path().join("d.jsonl"),
        &[
            serde_json::json!({"prompt": words(&[1, 2, 3, 4, 5]), "response": words(&[6])}),
            serde_json::json!({"prompt": words(&[1]), "response": words(&[7, 8, 9, 10])}),
            serde_json::json!({"prompt": words(&[1, 2]), "response": words(&[3, 4])}),
        ],
    );
    let mut o = opts(tmp.path(), input, Task::Seq2seq);
    o.max_len = Some(3);
    o.max_target_len = Some(4);
    let store = TokenStore::open(&run(&o).unwrap().store).unwrap();
    assert_eq!(row(&store, 0).source().to_vec(), with_eos(ids(&[1, 2])));
    assert_eq!(
        row(&store, 1).target().unwrap().to_vec(),
        with_eos(ids(&[7, 8, 9]))
    );
    assert_eq!(row(&store, 2).source().to_vec(), with_eos(ids(&[1, 2])));
    assert_eq!(store.meta().counts.truncated, 2);
    o.max_len = Some(1);
    assert!(matches!(run(&o), Err(DataError::Options(_))));
}

fn messy_rows(dir: &Path) -> PathBuf {
    common::write_jsonl(
        &dir.join("messy.jsonl"),
        &[
            serde_json::json!({"prompt": words(&[1]), "response": words(&[2])}),
            serde_json::json!({"prompt": null, "response": words(&[2])}),
            serde_json::json!({"prompt": "   ", "response": words(&[3])}),
            serde_json::json!({"prompt": words(&[4]), "response": 17}),
            serde_json::json!({"prompt": words(&[5]), "response": words(&[6])}),
        ],
    )
}

#[test]
fn invalid_policy_fail_names_file_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), messy_rows(tmp.path()), Task::Seq2seq);
    let err = run(&o).unwrap_err();
    match &err {
        DataError::InvalidRow {
            path,
            location,
            column,
            reason,
        } => {
            assert!(path.ends_with("messy.jsonl"));
            assert_eq!(*location, Location::Line(2));
            assert_eq!(column, "prompt");
            assert!(reason.contains("null"), "{reason}");
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.is_bad_input());
    assert!(err.to_string().contains("line 2, column `prompt`"), "{err}");
    assert!(!o.out.exists(), "no store after a failure");
    assert_eq!(common::hidden_entries(tmp.path()), Vec::<String>::new());
}

#[test]
fn invalid_policy_skip_and_keep_count_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = opts(tmp.path(), messy_rows(tmp.path()), Task::Seq2seq);
    o.on_invalid = InvalidPolicy::Skip;
    let m = run(&o).unwrap().meta;
    assert_eq!((m.counts.read, m.counts.written), (5, 2));
    assert_eq!(
        (m.counts.empty, m.counts.invalid, m.counts.skipped),
        (1, 2, 3)
    );
    let store = TokenStore::open(&o.out).unwrap();
    assert_eq!(row(&store, 1).source().to_vec(), with_eos(ids(&[5])));

    o.on_invalid = InvalidPolicy::Keep;
    let m = run(&o).unwrap().meta;
    assert_eq!((m.counts.written, m.counts.skipped), (5, 0));
    let store = TokenStore::open(&o.out).unwrap();
    assert_eq!(
        row(&store, 1).source().to_vec(),
        vec![EOS],
        "a null prompt kept as empty"
    );
}

#[test]
fn bad_parquet_inputs_are_errors_that_name_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let tok = common::tokenizer(d);
    let try_prepare = |input: PathBuf| {
        let o = PrepareOptions::new(vec![input], tok.clone(), Task::Seq2seq, d.join("s"));
        let r = run(&o);
        assert!(!d.join("s").exists());
        r.unwrap_err()
    };
    // Missing column.
    let p = common::write_parquet(
        &d.join("a.parquet"),
        vec![("prompt", common::string_array(vec![Some("w1")]))],
        8,
    );
    let e = try_prepare(p);
    assert!(
        matches!(&e, DataError::MissingColumn { column, .. } if column == "response"),
        "{e}"
    );
    assert!(e.to_string().contains("a.parquet") && e.to_string().contains("response"));
    // Wrong type.
    let p = common::write_parquet(
        &d.join("b.parquet"),
        vec![
            ("prompt", common::string_array(vec![Some("w1")])),
            ("response", common::int_array(vec![Some(3)])),
        ],
        8,
    );
    assert!(matches!(try_prepare(p), DataError::ColumnType { column, .. } if column == "response"));
    // Null value, at a known row of the third row group.
    let mut v: Vec<Option<&str>> = vec![Some("w1"); 20];
    v[17] = None;
    let p = common::write_parquet(
        &d.join("c.parquet"),
        vec![
            ("prompt", common::string_array(vec![Some("w2"); 20])),
            ("response", common::string_array(v)),
        ],
        8,
    );
    let e = try_prepare(p);
    assert!(
        e.to_string().contains("row 17, column `response`: null"),
        "{e}"
    );
    // Non-UTF-8 bytes in a binary column.
    let bad: &[u8] = b"w1 \xff\xfe";
    let p = common::write_parquet(
        &d.join("d.parquet"),
        vec![
            ("prompt", common::binary_array(vec![Some(b"w1"), Some(bad)])),
            (
                "response",
                common::string_array(vec![Some("w2"), Some("w3")]),
            ),
        ],
        8,
    );
    let e = try_prepare(p);
    assert!(
        e.to_string()
            .contains("row 1, column `prompt`: not valid UTF-8"),
        "{e}"
    );
    // Empty file and truncated file.
    std::fs::write(d.join("e.parquet"), b"").unwrap();
    assert!(matches!(
        try_prepare(d.join("e.parquet")),
        DataError::Corrupt { .. }
    ));
    let good = common::seq2seq_parquet(&d.join("f.parquet"), 100, 10);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(d.join("g.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let e = try_prepare(d.join("g.parquet"));
    assert!(
        matches!(e, DataError::Corrupt { .. }) && e.to_string().contains("g.parquet"),
        "{e}"
    );
    // Garbage in the middle of the data pages (footer intact).
    let mut corrupt = bytes.clone();
    for b in &mut corrupt[200..600] {
        *b = 0x55;
    }
    std::fs::write(d.join("h.parquet"), &corrupt).unwrap();
    let e = try_prepare(d.join("h.parquet"));
    assert!(
        e.is_bad_input() && e.to_string().contains("h.parquet"),
        "{e}"
    );
    // A parquet file with no rows.
    let p = common::write_parquet(
        &d.join("i.parquet"),
        vec![
            ("prompt", common::string_array(vec![])),
            ("response", common::string_array(vec![])),
        ],
        8,
    );
    assert!(matches!(try_prepare(p), DataError::EmptySource { .. }));
    assert_eq!(
        common::hidden_entries(d),
        Vec::<String>::new(),
        "no temporary directories left"
    );
}

#[test]
fn bad_jsonl_inputs_are_errors_that_name_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let tok = common::tokenizer(d);
    let try_prepare = |name: &str, bytes: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = PrepareOptions::new(vec![p], tok.clone(), Task::Seq2seq, d.join("s"));
        let e = run(&o).unwrap_err();
        assert!(!d.join("s").exists());
        assert!(e.is_bad_input());
        e.to_string()
    };
    assert!(try_prepare("empty.jsonl", b"").contains("has no rows"));
    assert!(try_prepare("blank.jsonl", b"\n\n").contains("has no rows"));
    let e = try_prepare("missing.jsonl", b"{\"prompt\": \"w1\"}\n");
    assert!(e.contains("no column `response`"), "{e}");
    let e = try_prepare("utf8.jsonl", b"{\"prompt\": \"w1\", \"response\": \"w2\"}\n{\"prompt\": \"\xff\", \"response\": \"w2\"}\n");
    assert!(e.contains("line 2") && e.contains("UTF-8"), "{e}");
    let e = try_prepare(
        "json.jsonl",
        b"{\"prompt\": \"w1\", \"response\": \"w2\"}\n{\"prompt\": \n",
    );
    assert!(e.contains("line 2") && e.contains("not valid JSON"), "{e}");
    let e = try_prepare("nope.jsonl.missing", b"x");
    assert!(e.contains("nope.jsonl.missing"), "{e}");
    std::fs::remove_file(d.join("nope.jsonl.missing")).unwrap();
    let o = PrepareOptions::new(
        vec![d.join("absent.jsonl")],
        tok.clone(),
        Task::Seq2seq,
        d.join("s"),
    );
    let e = run(&o).unwrap_err();
    assert!(
        e.is_bad_input() && e.to_string().contains("absent.jsonl"),
        "{e}"
    );
}

#[test]
fn a_tokenizer_without_eos_or_pad_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 10);
    let no_eos = common::word_tokenizer(&tmp.path().join("no_eos"), 20, &["[PAD]"]);
    let o = PrepareOptions::new(
        vec![input.clone()],
        no_eos,
        Task::Seq2seq,
        tmp.path().join("s"),
    );
    let e = run(&o).unwrap_err();
    assert!(
        matches!(e, DataError::MissingSpecialToken { role: "EOS", .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("[EOS]") && e.to_string().contains("seq2seq"),
        "{e}"
    );
    let no_pad = common::word_tokenizer(&tmp.path().join("no_pad"), 20, &["[EOS]"]);
    let o = PrepareOptions::new(vec![input], no_pad, Task::Seq2seq, tmp.path().join("s"));
    assert!(matches!(
        run(&o),
        Err(DataError::MissingSpecialToken { role: "PAD", .. })
    ));
    let o = PrepareOptions::new(
        vec![tmp.path().join("d.jsonl")],
        tmp.path().join("nowhere"),
        Task::Seq2seq,
        tmp.path().join("s"),
    );
    assert!(run(&o).unwrap_err().is_bad_input());
    assert!(!tmp.path().join("s").exists());
}

#[test]
fn an_up_to_date_store_is_reused_and_a_changed_source_rebuilds() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 50);
    let o = opts(tmp.path(), input.clone(), Task::Seq2seq);
    let first = run(&o).unwrap();
    let tokens = o.out.join("tokens.bin");
    let mtime = std::fs::metadata(&tokens).unwrap().modified().unwrap();
    let again = run(&o).unwrap();
    assert!(again.reused);
    assert_eq!(again.meta.fingerprint, first.meta.fingerprint);
    assert_eq!(
        std::fs::metadata(&tokens).unwrap().modified().unwrap(),
        mtime
    );
    // A different max length is different content.
    let mut o2 = o.clone();
    o2.max_len = Some(3);
    assert!(!run(&o2).unwrap().reused);
    // A changed source.
    common::seq2seq_jsonl(&input, 60);
    let rebuilt = run(&o).unwrap();
    assert!(!rebuilt.reused);
    assert_eq!(TokenStore::open(&o.out).unwrap().len(), 60);
    let mut forced = o.clone();
    forced.force = true;
    assert!(!run(&forced).unwrap().reused);
    assert_eq!(common::hidden_entries(tmp.path()), Vec::<String>::new());
}

#[test]
fn interrupted_builds_leave_nothing_that_looks_like_a_store() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 50);
    let o = opts(tmp.path(), input, Task::Seq2seq);
    // What a killed run leaves: a partial directory named after a process that no longer exists.
    let dead = tmp.path().join(".out.store.partial-4000000");
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join("tokens.bin"), b"xx").unwrap();
    assert!(
        TokenStore::open(&dead).is_err(),
        "no meta.json: not a store"
    );
    run(&o).unwrap();
    assert!(!dead.exists(), "stale partial build removed");
    // A directory without meta.json (an unfinished store) is not opened…
    std::fs::remove_file(o.out.join("meta.json")).unwrap();
    let e = TokenStore::open(&o.out).unwrap_err();
    assert!(e.to_string().contains("no meta.json"), "{e}");
    // …and a rerun replaces it with a complete one.
    run(&o).unwrap();
    assert_eq!(TokenStore::open(&o.out).unwrap().len(), 50);
    // A directory that is not a store is never replaced.
    let other = tmp.path().join("precious");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep me").unwrap();
    let mut o3 = o.clone();
    o3.out = other.clone();
    assert!(run(&o3).is_err());
    assert!(other.join("notes.txt").exists());
}

#[test]
fn corrupt_store_files_are_refused_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 30);
    let o = opts(tmp.path(), input, Task::Seq2seq);
    run(&o).unwrap();
    let index = o.out.join("index.bin");
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[8 * 5..8 * 6].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&index, &bytes).unwrap();
    assert!(
        TokenStore::open(&o.out)
            .unwrap_err()
            .to_string()
            .contains("index is corrupt")
    );
    let mut o2 = o.clone();
    o2.force = true;
    run(&o2).unwrap();
    let tokens = o.out.join("tokens.bin");
    let t = std::fs::read(&tokens).unwrap();
    std::fs::write(&tokens, &t[..t.len() - 2]).unwrap();
    assert!(
        TokenStore::open(&o.out)
            .unwrap_err()
            .to_string()
            .contains("tokens.bin")
    );
}

#[test]
fn large_vocabularies_use_u32_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = common::word_tokenizer(&tmp.path().join("big"), 70_000, &["[PAD]", "[EOS]"]);
    let input = common::write_jsonl(
        &tmp.path().join("d.jsonl"),
        &[serde_json::json!({"prompt": "w69999 w1", "response": "w65533"})],
    );
    let o = PrepareOptions::new(vec![input], tok, Task::Seq2seq, tmp.path().join("s"));
    let m = run(&o).unwrap().meta;
    assert_eq!(m.token_width, 4);
    let store = TokenStore::open(&o.out).unwrap();
    assert_eq!(row(&store, 0).source().to_vec(), vec![70_002, 4, EOS]);
    assert_eq!(row(&store, 0).target().unwrap().to_vec(), vec![65_536, EOS]);
}

#[test]
fn classification_with_string_and_integer_labels() {
    use common::special_tokenizers::{CLS, Processor, SEP, classification_tokenizer, cls_words};
    let tmp = tempfile::tempdir().unwrap();
    let bert = classification_tokenizer(&tmp.path().join("bert"), 100, Processor::Bert);
    let rows: Vec<serde_json::Value> = (0..6)
        .map(|i| {
            let label = ["neg", "pos", "neutral"][i as usize % 3];
            serde_json::json!({"text": words(&[i, i + 1]), "label": label})
        })
        .collect();
    let input = common::write_jsonl(&tmp.path().join("c.jsonl"), &rows);
    let mut o = opts(tmp.path(), input, Task::Classification);
    o.tokenizer = bert.clone();
    o.max_len = Some(3);
    let report = run(&o).unwrap();
    assert_eq!(report.meta.label_names, vec!["neg", "pos", "neutral"]);
    assert_eq!(report.meta.num_labels, Some(3));
    assert_eq!(report.meta.counts.truncated, 6, "{:?}", report.meta);
    let store = TokenStore::open(&o.out).unwrap();
    assert_eq!(
        row(&store, 4).source().to_vec(),
        [vec![CLS], cls_words(&[4]), vec![SEP]].concat(),
        "no EOS: the tokenizer's own specials, kept when cut"
    );
    assert_eq!(row(&store, 4).label(), Some(1));
    assert!(row(&store, 4).target().is_none());
    let b = store.classification_batch(&[0, 2]).unwrap();
    assert_eq!((b.batch, b.len, b.labels.clone()), (2, 3, vec![0, 2]));
    assert_eq!(b.token_types, None);
    assert!(store.seq2seq_batch(&[0]).is_err());

    let pq = common::write_parquet(
        &tmp.path().join("c.parquet"),
        vec![
            (
                "sentence",
                common::string_array(vec![Some("w1"), Some("w2 w3"), Some("w4")]),
            ),
            ("y", common::int_array(vec![Some(1), Some(0), Some(-3)])),
        ],
        2,
    );
    let mut o = PrepareOptions::new(vec![pq], bert, Task::Classification, tmp.path().join("c2"));
    o.columns = Some(vec!["sentence".into(), "y".into()]);
    let e = run(&o).unwrap_err();
    assert!(e.to_string().contains("row 2, column `y`"), "{e}");
    o.on_invalid = InvalidPolicy::Skip;
    let store = TokenStore::open(&run(&o).unwrap().store).unwrap();
    assert_eq!(store.len(), 2);
    assert_eq!(
        (row(&store, 0).label(), row(&store, 1).label()),
        (Some(1), Some(0))
    );
    assert!(store.meta().label_names.is_empty());
    assert_eq!(store.label_names().unwrap(), vec!["LABEL_0", "LABEL_1"]);
}

#[test]
fn chat_joins_instruction_and_input() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::write_jsonl(
        &tmp.path().join("chat.jsonl"),
        &[
            serde_json::json!({"instruction": "w1 w2", "input": "w3", "output": "w4"}),
            serde_json::json!({"instruction": "w5", "input": null, "output": "w6 w7"}),
        ],
    );
    let store =
        TokenStore::open(&run(&opts(tmp.path(), input, Task::Chat)).unwrap().store).unwrap();
    assert_eq!(row(&store, 0).source().to_vec(), with_eos(ids(&[1, 2, 3])));
    assert_eq!(row(&store, 1).source().to_vec(), with_eos(ids(&[5])));
    assert_eq!(
        row(&store, 1).target().unwrap().to_vec(),
        with_eos(ids(&[6, 7]))
    );
}

#[test]
fn padded_seq2seq_batch_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::write_jsonl(
        &tmp.path().join("d.jsonl"),
        &[
            serde_json::json!({"prompt": words(&[1, 2]), "response": words(&[3])}),
            serde_json::json!({"prompt": words(&[4]), "response": words(&[5, 6, 7])}),
        ],
    );
    let store =
        TokenStore::open(&run(&opts(tmp.path(), input, Task::Seq2seq)).unwrap().store).unwrap();
    let b = store.seq2seq_batch(&[1, 0]).unwrap();
    let w = |k: u32| common::FIRST_WORD_ID + k;
    assert_eq!((b.batch, b.src_len, b.tgt_len), (2, 3, 4));
    assert_eq!(b.input_ids, vec![w(4), EOS, PAD, w(1), w(2), EOS]);
    assert_eq!(b.input_mask, vec![true, true, false, true, true, true]);
    assert_eq!(b.labels, vec![w(5), w(6), w(7), EOS, w(3), EOS, PAD, PAD]);
    assert_eq!(
        b.label_mask,
        vec![true, true, true, true, true, true, false, false]
    );
    assert!(store.seq2seq_batch(&[2]).is_err());
}

#[test]
fn sampler_over_a_store_resumes_mid_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 300);
    let store =
        TokenStore::open(&run(&opts(tmp.path(), input, Task::Seq2seq)).unwrap().store).unwrap();
    let lengths = store.row_lengths().unwrap();
    assert_eq!(lengths[3], row(&store, 3).total_tokens() as u32);
    let mut cfg = SamplerConfig::new(11, Batching::Tokens(64));
    cfg.group_window = Some(8);
    cfg.world = 2;
    cfg.rank = 1;
    let mut straight = Sampler::new(cfg.clone(), lengths.clone()).unwrap();
    let steps = straight.steps_in_epoch();
    let all: Vec<_> = (0..steps + 5)
        .map(|_| store.seq2seq_batch(&straight.next_batch()).unwrap())
        .collect();
    let mut first = Sampler::new(cfg.clone(), lengths.clone()).unwrap();
    for _ in 0..steps - 2 {
        first.next_batch();
    }
    let saved = serde_json::to_value(first.cursor()).unwrap();
    let mut resumed =
        Sampler::resume(cfg, lengths, serde_json::from_value(saved).unwrap()).unwrap();
    let rest: Vec<_> = (0..7)
        .map(|_| store.seq2seq_batch(&resumed.next_batch()).unwrap())
        .collect();
    assert_eq!(rest, all[steps - 2..]);
    for b in &all {
        assert!(
            b.batch == 1 || b.batch * (b.src_len + b.tgt_len) <= 64 * 2,
            "budget roughly kept"
        );
    }
}
