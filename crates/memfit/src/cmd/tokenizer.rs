//! `memfit tokenizer` (not built yet).

use crate::exit::{Outcome, bad_input};

#[derive(clap::Args)]
pub struct Args {
    /// Arguments, once the command exists.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub fn run(_args: Args) -> Outcome {
    Err(bad_input("`memfit tokenizer` is not implemented yet"))
}
