//! What `memfit train` shows while it runs and when it ends: a progress bar on a terminal, plain
//! lines otherwise (`memfit_train::progress`), evaluation progress and cost, and the summary.

use super::gib;
use indicatif::{ProgressBar, ProgressStyle};
use memfit_train::config::TrainConfig;
use memfit_train::eval::{EvalPhase, EvalReport};
use memfit_train::metrics::StepMetrics;
use memfit_train::progress::{self, Cadence};
use memfit_train::train_loop::{Finish, Observer, Summary};
use memfit_train::verdict::Verdict;
use std::path::Path;
use std::time::Instant;

/// The progress bar (epoch, step, loss, tokens/s, RSS) on a terminal; with stderr not a terminal, or
/// `--json`, plain lines on stderr at `progress`'s cadence.
pub(super) struct Bar {
    pub(super) bar: ProgressBar,
    /// No bar is drawn: progress goes out as plain lines.
    plain: bool,
    steps: Cadence,
    eval: Cadence,
    started: Instant,
    total: u64,
    start_step: u64,
}

impl Bar {
    pub(super) fn new(quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} steps {elapsed_precise} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            plain: bar.is_hidden(),
            bar,
            steps: Cadence::default(),
            eval: Cadence::default(),
            started: Instant::now(),
            total: 0,
            start_step: 0,
        }
    }

    fn line(&self, message: &str) {
        if self.plain {
            eprintln!("{message}");
        } else {
            self.bar.println(message);
        }
    }
}

impl Observer for Bar {
    fn on_start(&mut self, total_steps: u64, start_step: u64) {
        self.bar.set_length(total_steps);
        self.bar.set_position(start_step);
        (self.total, self.start_step, self.started) = (total_steps, start_step, Instant::now());
    }
    fn on_step(&mut self, m: &StepMetrics) {
        self.bar.set_position(m.step);
        self.bar.set_message(format!(
            "epoch {} loss {:.4} {:.0} tok/s RSS {}",
            m.epoch,
            m.loss,
            m.tokens_per_s,
            gib(m.rss_bytes)
        ));
        let elapsed = self.started.elapsed().as_secs_f64();
        let edge = m.step == self.start_step + 1 || m.step == self.total;
        if self.plain && self.steps.due(elapsed, m.step, edge) {
            let done = m.step - self.start_step;
            let eta = progress::eta_s(done, self.total.saturating_sub(m.step), elapsed);
            eprintln!("{}", progress::step_line(m, self.total, eta));
        }
    }
    fn on_eval_progress(&mut self, step: u64, phase: EvalPhase, done: usize, total: usize) {
        let line = format!("eval at step {step}: {} {done}/{total} rows", phase.name());
        if !self.plain {
            self.bar.set_message(line);
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        if done == 0 {
            // a quick evaluation prints only its cost line (on_eval)
            self.eval.start(elapsed);
        } else if done < total && self.eval.due(elapsed, done as u64, false) {
            eprintln!("{line}");
        }
    }
    fn on_eval(&mut self, step: u64, r: &EvalReport) {
        let sample = r
            .samples
            .first()
            .map(|(want, got)| format!(" e.g. {want:?} → {got:?}"))
            .unwrap_or_default();
        self.line(&format!(
            "eval at step {step}: {}: {}{sample}",
            r.cost(),
            r.describe()
        ));
    }
    fn on_message(&mut self, message: &str) {
        self.line(message);
    }
}

pub(super) fn print_summary(
    s: &Summary,
    verdict: &Verdict,
    config: &TrainConfig,
    root: &Path,
    json: bool,
) {
    if json {
        print_summary_json(s, verdict, config, root);
    } else {
        print_summary_text(s, config, root);
        if let Some(why) = verdict.describe() {
            println!("  verdict    {why}");
        }
    }
}

/// The summary as one JSON object (`--json`).
fn print_summary_json(s: &Summary, verdict: &Verdict, config: &TrainConfig, root: &Path) {
    let best_dir = root.join("best");
    let score = |name: &str| s.last_eval.as_ref().and_then(|e| e.score(name));
    let headline_after = score(s.headline);
    let v = serde_json::json!({
        "finished": s.finish == Finish::Completed && s.unsaved.is_none(),
        "unsaved": s.unsaved.as_ref().map(ToString::to_string),
        "steps": s.steps,
        "total_steps": s.total_steps,
        "loss_first": s.first_loss,
        "loss_last": s.last_loss,
        "task": config.task.name(),
        "headline": s.headline,
        "before": s.score_before,
        "after": headline_after,
        "bleu4_before": (s.headline == "bleu4").then_some(s.score_before).flatten(),
        "bleu4_after": score("bleu4"),
        "bleu4_standard_after": score("bleu4_standard"),
        "accuracy_after": score("accuracy"),
        "macro_f1_after": score("macro_f1"),
        "valid_loss_after": s.last_eval.as_ref().map(|e| e.valid_loss),
        "classes": s.last_eval.as_ref().map(|e| &e.classes).filter(|c| !c.is_empty()),
        "peak_rss_bytes": s.peak_rss_bytes,
        "budget_bytes": config.memory_budget_bytes,
        "tokens_per_s": s.tokens_per_s(),
        "seconds": s.seconds,
        "train_seconds": s.train_seconds,
        "run_dir": root,
        "best_dir": best_dir.is_dir().then_some(&best_dir),
        "best": s.best.as_ref().map(|b| serde_json::json!({"metric": b.metric, "value": b.value, "step": b.step})),
        "last_checkpoint": s.last_checkpoint,
        "regressed": verdict.regressed,
        "collapsed_to": verdict.collapsed_to,
    });
    println!("{v}");
}

/// The summary as the lines a person reads.
fn print_summary_text(s: &Summary, config: &TrainConfig, root: &Path) {
    let best_dir = root.join("best");
    let score = |name: &str| s.last_eval.as_ref().and_then(|e| e.score(name));
    let headline_after = score(s.headline);
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.4}"));
    let verb = match (s.finish, &s.unsaved) {
        (_, Some(_)) => "ended without saving its model",
        (Finish::Completed, None) => "finished",
        (Finish::Stopped, None) => "stopped (resume with --resume)",
    };
    println!(
        "memfit train {verb}: {}/{} steps in {:.1} s",
        s.steps, s.total_steps, s.seconds
    );
    println!("  loss       {} → {}", opt(s.first_loss), opt(s.last_loss));
    match s.headline {
        "bleu4" => println!(
            "  BLEU-4     {} → {} (standard, brevity penalty ≤ 1: {})",
            opt(s.score_before),
            opt(headline_after),
            opt(score("bleu4_standard"))
        ),
        "accuracy" => println!(
            "  accuracy   {} → {} (macro-F1 {})",
            opt(s.score_before),
            opt(headline_after),
            opt(score("macro_f1"))
        ),
        other => println!(
            "  {other:<10} {} → {}",
            opt(s.score_before),
            opt(headline_after)
        ),
    }
    for c in s.last_eval.iter().flat_map(|e| &e.classes) {
        println!(
            "    {:<16} precision {:.3} recall {:.3} F1 {:.3} ({} rows)",
            c.label, c.precision, c.recall, c.f1, c.support
        );
    }
    match config.memory_budget_bytes {
        Some(b) => println!(
            "  peak RSS   {} of a {} budget ({})",
            gib(s.peak_rss_bytes),
            gib(b),
            if s.peak_rss_bytes <= b {
                "within"
            } else {
                "OVER"
            }
        ),
        None => println!("  peak RSS   {}", gib(s.peak_rss_bytes)),
    }
    println!(
        "  tokens/s   {:.0} (training steps; {:.0} s of {:.0} s wall)",
        s.tokens_per_s(),
        s.train_seconds,
        s.seconds
    );
    println!("  run        {}", root.display());
    if let Some(b) = &s.best {
        println!(
            "  best       {} ({} {:.4} at step {})",
            best_dir.display(),
            b.metric,
            b.value,
            b.step
        );
    }
    if let Some(c) = &s.last_checkpoint {
        println!("  checkpoint {}", c.display());
    }
}
