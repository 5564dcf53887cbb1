//! One module per subcommand; each owns its `Args` and its `run`.

pub mod bench;
pub mod bench_matmul;
pub mod bench_train;
pub mod calibrate;
pub mod check;
pub mod data;
pub mod estimate;
pub mod export;
pub mod plan;
pub mod predict;
pub mod report;
pub mod run;
pub mod tokenizer;
pub mod train;
