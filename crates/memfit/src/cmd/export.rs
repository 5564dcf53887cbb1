//! `memfit export CHECKPOINT [--merge] --out DIR`: a checkpoint as the Hugging Face directory its
//! family loads from (memfit_train::checkpoint::export); this parses, calls it, prints.

use crate::exit::{Outcome, bad_input};
use memfit_train::checkpoint::export::export;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A checkpoint directory (RUN/best, RUN/checkpoints/step-N).
    checkpoint: PathBuf,
    /// Where to write the model (must not exist, or be empty).
    #[arg(long)]
    out: PathBuf,
    /// A LoRA checkpoint: merge the adapter into its base model (W + B·A·alpha/r) and write the
    /// full model AutoModelForCausalLM loads.
    #[arg(long)]
    merge: bool,
}

pub fn run(args: Args) -> Outcome {
    let files = export(&args.checkpoint, &args.out, args.merge).map_err(|e| {
        if e.is_bad_input() {
            bad_input(e.to_string())
        } else {
            anyhow::Error::new(e)
        }
    })?;
    eprintln!(
        "exported {} into {}: {}",
        args.checkpoint.display(),
        args.out.display(),
        files.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}
