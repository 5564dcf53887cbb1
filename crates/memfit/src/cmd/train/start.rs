//! Before a run exists: its directory claimed and locked (a new run's cleaned up again if the start
//! fails: only what the start added), the demo's files, the data (prepared into the run), the
//! sequence length taken from the data and the start planned for it, and the model's config
//! checked against the tokenizer. Nothing here writes `config.toml`: until the session starts, a
//! failed start leaves nothing (exit 3 included).

use super::absolute;
use super::launch::Prepared;
use super::setup::{Available, Mode, PlanAfterData, Setup};
use super::{budget, fit};
use crate::exit::bad_input;
use anyhow::Context;
use indicatif::ProgressBar;
use memfit_train::config::TaskKind;
use memfit_train::run_data::{self, RunData};
use memfit_train::run_lock::{Claim, ClaimError};
use memfit_train::{demo, model_spec};
use serde_json::Value;
use std::path::Path;

/// A start whose data and model config are ready.
pub struct Start {
    pub setup: Setup,
    pub data: RunData,
    /// The model's `config.json`.
    pub model_json: Value,
    /// The run directory, locked; a new run's is cleaned up unless the run gets going.
    pub claim: Claim,
}

impl Start {
    /// The data for the task; the rest for the run.
    pub fn split(self) -> (RunData, Prepared) {
        let vocab = self.data.tokenizer.vocab_size();
        let prepared = Prepared {
            setup: self.setup,
            model_json: self.model_json,
            claim: self.claim,
            vocab,
        };
        (self.data, prepared)
    }
}

impl Start {
    pub fn prepare(mut setup: Setup) -> anyhow::Result<Self> {
        let claim = match setup.mode {
            Mode::New => make_root(&setup.root)?,
            Mode::Resume => Claim::resume(&setup.root).map_err(|e| bad_input(e.to_string()))?,
        };
        if matches!(setup.mode, Mode::New) && setup.config.data.is_none() {
            write_demo(&mut setup)?;
        }
        let mut data = open_data(&setup)?;
        // Reading and tokenizing freed far more than it keeps (parquet pages, JSON, text): hand
        // those pages back before the model and the steps allocate beside what stays.
        memfit_train::malloc_tuning::release_free();
        let model_json =
            model_spec::model_config(&setup.config.model, setup.demo_config.as_deref())
                .map_err(|e| bad_input(e.to_string()))?;
        if let Some(pending) = setup.plan_after_data.take() {
            data = plan_with_data(&mut setup, pending, data, &model_json)?;
        }
        if matches!(setup.mode, Mode::New) {
            fit::warn_truncation(&data, &setup.config);
            if let Some(line) = setup.fit.line() {
                setup.plan_lines.insert(0, line);
            }
        }
        model_spec::check_vocab(&model_json, &setup.config.model, &data.tokenizer)
            .map_err(|e| bad_input(e.to_string()))?;
        Ok(Self {
            setup,
            data,
            model_json,
            claim,
        })
    }
}

/// The start planned once the data is prepared, beside what the data and tokenizer hold. Where the
/// sequence length comes from the data: the longest prepared row (rounded up, at most the model's
/// positions), shorter, and said so, where the budget holds no more (the data is then prepared
/// again at that length, as a resume would prepare it).
fn plan_with_data(
    setup: &mut Setup,
    pending: PlanAfterData,
    data: RunData,
    model_json: &Value,
) -> anyhow::Result<RunData> {
    let (longest, longest_tgt) = fit::longest_rows(setup.config.task, &data)?;
    let mut at = setup.config.clone();
    if setup.fit.tgt_seq_from_data {
        at.tgt_seq = fit::seq_for(longest_tgt, pending.max_seq);
        at.gen_max_tokens = at.tgt_seq;
        let line = format!("tgt_seq {} (longest target {longest_tgt})", at.tgt_seq);
        setup.fit.chosen.push(line);
    }
    let from_data = setup.fit.seq_from_data;
    let wanted = match from_data {
        true => fit::seq_for(longest, pending.max_seq),
        false => at.seq,
    };
    let available = Available::known(pending.available_bytes);
    at.seq = wanted;
    let resident = resident_beyond_runtime();
    let planned = loop {
        let mut flags = setup.flags.clone();
        flags.seq = Some(at.seq);
        let mut budget = pending.budget.clone();
        budget.resident_bytes = resident;
        match budget::plan_start(&pending.policy, &flags, &at, model_json, budget, &available) {
            Ok(planned) => break planned,
            Err(e) if from_data && does_not_fit(&e) && at.seq > MIN_DATA_SEQ => {
                at.seq = (at.seq / 2).max(MIN_DATA_SEQ);
            }
            Err(e) => return Err(e),
        }
    };
    let seq = planned.config.seq;
    if from_data {
        setup
            .fit
            .chosen
            .push(seq_reason(seq, wanted, longest, pending.max_seq));
    }
    setup.config = planned.config;
    setup.planning = Some(planned.planning);
    setup.plan_lines = planned.lines;
    if resident > 0 {
        let held = memfit_sys::units::human_bytes(resident);
        let line = format!(
            "  data and tokenizer: {held} resident before the model (measured), planned beside it"
        );
        setup.plan_lines.push(line);
    }
    if seq < wanted {
        drop(data);
        return open_data(setup);
    }
    Ok(data)
}

/// What this process holds beyond the planner's runtime constant once its data is prepared (the
/// tokenizer, the readers' state, the validation rows), read as the memory guard reads it: the
/// start is planned with it as measured. 0 where /proc cannot be read.
fn resident_beyond_runtime() -> u64 {
    let charged = memfit_train::memory_guard::own_charged_bytes();
    charged.saturating_sub(memfit_plan::memory::memfit_host::FITTED.runtime_rss)
}

/// "seq 64 (longest row 61)", with what cut it shorter.
fn seq_reason(seq: usize, wanted: usize, longest: usize, max_seq: usize) -> String {
    let mut why = format!("seq {seq} (longest row {longest}");
    if wanted == max_seq && longest > wanted {
        why += &format!("; the model's {max_seq} positions");
    }
    if seq < wanted {
        why += &format!("; the budget holds no more than {seq}");
    }
    why + ")"
}

/// The shortest sequence a start planned from the data comes down to before it does not fit.
const MIN_DATA_SEQ: usize = 16;

fn does_not_fit(e: &anyhow::Error) -> bool {
    e.downcast_ref::<crate::exit::Exit>()
        .is_some_and(|x| x.code == 3)
}

/// Claims a new run's directory (refusing one that holds a run or that another process holds) and
/// checks it is writable.
fn make_root(root: &Path) -> anyhow::Result<Claim> {
    let claim = Claim::new_run(root).map_err(|e| match e {
        ClaimError::Lock(memfit_train::run_lock::LockError::Io { source, .. }) => {
            bad_input(format!(
                "--out {}: cannot create the run directory: {source}",
                root.display()
            ))
        }
        e => bad_input(e.to_string()),
    })?;
    let probe = root.join(".memfit-write-test");
    std::fs::write(&probe, b"")
        .map_err(|e| bad_input(format!("--out {}: not writable: {e}", root.display())))?;
    let _ = std::fs::remove_file(&probe);
    Ok(claim)
}

/// The demo of the run's task: its data and tokenizer, and (for the demo's model) its config.
fn write_demo(setup: &mut Setup) -> anyhow::Result<()> {
    let dir = setup.root.join("demo");
    let config = &mut setup.config;
    let files = match config.task {
        TaskKind::Classification => demo::classification::write(&dir, config.seed),
        _ => demo::seq2seq::write(&dir, config.seed),
    }
    .with_context(|| format!("writing the demo task into {}", dir.display()))?;
    let path = |p: &Path| Some(absolute(&p.display().to_string()));
    config.data = path(&files.train);
    config.valid = path(&files.valid);
    config.tokenizer = path(&files.tokenizer_dir);
    if config.model == "demo" {
        setup.demo_config = Some(files.model_config);
    }
    Ok(())
}

/// The tokenizer and the stores, preparing sources into the run with a spinner.
fn open_data(setup: &Setup) -> anyhow::Result<RunData> {
    let bar = ProgressBar::new_spinner();
    let data = run_data::open(&setup.config, &setup.root, &mut |name, rows, total| {
        bar.set_message(format!(
            "preparing {name}: {rows}/{} rows",
            total.map_or("?".into(), |t| t.to_string())
        ));
        bar.tick();
    })
    .map_err(|e| {
        if e.is_bad_input() {
            bad_input(e.to_string())
        } else {
            anyhow::Error::new(e)
        }
    })?;
    bar.finish_and_clear();
    Ok(data)
}
