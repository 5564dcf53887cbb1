//! `memfit run` (not built yet).

use crate::exit::{bad_input, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Arguments, once the command exists.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub fn run(_args: Args) -> Outcome {
    Err(bad_input("`memfit run` is not implemented yet"))
}
