//! What `run` can fail with.

use crate::series::SeriesError;

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("no command given")]
    EmptyCommand,
    #[error(
        "the budget ({budget}) is below {floor}, the least a job is started under: the guard \
         would stop it as it starts; give a size such as 512MiB or 8GiB"
    )]
    BudgetBelowFloor { budget: String, floor: String },
    #[error("cannot open {path} for the job's output: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot read /proc/meminfo: the guard needs it")]
    NoMeminfo,
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Series(#[from] SeriesError),
    #[error("waiting for the job failed: {0}")]
    Wait(std::io::Error),
}
