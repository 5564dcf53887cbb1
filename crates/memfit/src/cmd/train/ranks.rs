//! The run's engine: one model replica per data-parallel rank of the chosen device (one rank
//! without data parallelism), and what the start line says of the ranks.

use super::model_error;
use memfit_nn::ModelError;
use memfit_nn::model::TrainModel;
use memfit_train::config::TrainConfig;
use memfit_train::data_parallel::{self, DataParallel};
use memfit_train::device::ChosenDevice;
use memfit_train::engine::{Backend, ModelEngine};
use memfit_train::engine_setup;

/// Rank 0 computes with `first`; every other rank with a model `more` builds on its backend (the
/// same weights: the same init or `--init` directory, the same seed). `shard_optimizer`: ZeRO-1.
pub fn engine<M: TrainModel + Send>(
    (config, device, shard_optimizer): (&TrainConfig, &ChosenDevice, bool),
    first: M,
    more: impl Fn(Backend) -> Result<M, ModelError>,
) -> anyhow::Result<DataParallel<ModelEngine<M>>> {
    let mut replicas = Vec::with_capacity(device.rank_count());
    let mut first = Some(first);
    for &backend in &device.ranks {
        let model = match first.take() {
            Some(m) => m,
            None => more(backend).map_err(model_error)?,
        };
        let mut options = engine_setup::engine_options(config, device);
        options.backend = backend;
        replicas.push(ModelEngine::new(model, options).map_err(model_error)?);
    }
    let collective = data_parallel::collective_for(&device.ranks);
    let group = DataParallel::new(replicas, collective);
    if !shard_optimizer {
        return Ok(group);
    }
    group
        .with_sharded_optimizer()
        .map_err(|e| crate::exit::bad_input(e.to_string()))
}

/// `data parallel: 3 ranks, …` for a group of several ranks; `accum` is the run's micro-batches
/// per step over all ranks (config.toml's).
pub fn line(config: &TrainConfig, device: &ChosenDevice, sharded: bool) -> Option<String> {
    let ranks = device.rank_count();
    (ranks > 1).then(|| {
        let per_rank = config.accum.div_ceil(ranks);
        let uneven = if config.accum.is_multiple_of(ranks) {
            String::new()
        } else {
            format!(" (the last group of a step leaves {} rank(s) idle)", ranks - config.accum % ranks)
        };
        // data_parallel::overlap: block by block under per-block checkpointing, when the last
        // group holds every rank's last micro-batch
        let reduce = match (config.grad_ckpt, config.accum.is_multiple_of(ranks)) {
            (true, true) => "gradients all-reduced block by block during each step's last backward",
            (false, _) => "gradients all-reduced after each step's last backward (overlapped only with --grad-ckpt)",
            (true, false) => "gradients all-reduced after each step's last backward",
        };
        format!(
            "data parallel: {ranks} ranks ({}), micro-batch {} × {} micro-batches a step = accumulation {per_rank} per rank{uneven}; effective batch {} (a planned start is per rank); {reduce}",
            device.label,
            config.batch,
            config.accum,
            config.batch * config.accum
        ) + if sharded {
            "; optimizer state sharded between the ranks (ZeRO-1)"
        } else {
            ""
        }
    })
}
