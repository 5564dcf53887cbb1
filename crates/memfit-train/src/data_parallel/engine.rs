//! [`DataParallel`] behind the loop's [`Engine`] and the task capabilities: micro-batches side by
//! side on the ranks, the step (reduce, update, ZeRO-1's gather), rank 0 for evaluation and
//! checkpoints.

use std::path::Path;

use super::{DataParallel, DataParallelError, overlap};

use crate::engine::{
    Classify, Continue, Engine, Generate, GenerateConfig, MicroBatch, ParamCounts, Replica,
    StepStats, TokenRows,
};

impl<E> Engine for DataParallel<E>
where
    E: Replica + Sync,
    E::Batch: Sync,
{
    type Batch = E::Batch;
    type Error = DataParallelError<E::Error>;

    fn accumulate(
        &mut self,
        batch: &E::Batch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, Self::Error> {
        let group = [MicroBatch {
            batch,
            loss_scale,
            seed,
        }];
        Ok(self.accumulate_group(&group)?[0])
    }

    fn ranks(&self) -> usize {
        self.replicas.len()
    }

    fn accumulate_group(
        &mut self,
        group: &[MicroBatch<'_, E::Batch>],
    ) -> Result<Vec<f32>, Self::Error> {
        let results = self
            .threads
            .on_every_rank(&mut self.replicas, |rank, replica| {
                // a step's last group may hold fewer micro-batches than there are ranks
                (group.get(rank))
                    .map(|m| replica.accumulate(m.batch, m.loss_scale, m.seed))
                    .transpose()
            })?;
        Ok(Self::first_error(results)?.into_iter().flatten().collect())
    }

    /// With a micro-batch for every rank, each rank's last of the step: the gradients are
    /// reduced during its backward ([`super::overlap`]); else as any group, reduced at the step.
    fn accumulate_last_group(
        &mut self,
        group: &[MicroBatch<'_, E::Batch>],
    ) -> Result<Vec<f32>, Self::Error> {
        let ranks = self.replicas.len();
        if ranks == 1 || group.len() < ranks {
            return self.accumulate_group(group);
        }
        let (collective, threads) = (self.collective.as_ref(), &self.threads);
        let results = threads.on_every_rank(&mut self.replicas, |rank, replica| {
            overlap::accumulate_reducing(
                replica,
                &group[rank],
                (collective, threads),
                (rank, ranks),
            )
        })?;
        let losses = Self::first_failure(results)?;
        self.reduced = true;
        Ok(losses)
    }

    /// Also makes the collective meet afresh: a rank that gave up part-way through an overlapped
    /// reduction aborted it.
    fn discard_gradients(&mut self) {
        self.replicas.iter_mut().for_each(E::discard_gradients);
        self.reduced = false;
        self.collective.reset();
    }

    fn is_out_of_memory(error: &Self::Error) -> bool {
        matches!(error, DataParallelError::Rank { source, .. } if E::is_out_of_memory(source))
    }

    fn is_rank_failure(error: &Self::Error) -> bool {
        match error {
            DataParallelError::Rank { source, .. } => !E::is_out_of_memory(source),
            DataParallelError::Panicked { .. }
            | DataParallelError::Collective(_)
            | DataParallelError::NotStarted(_) => true,
            DataParallelError::Update { .. } | DataParallelError::Save(_) => false,
        }
    }

    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, Self::Error> {
        if self.replicas.len() > 1 && !std::mem::take(&mut self.reduced) {
            self.reduce_gradients()?;
        }
        let results = self
            .threads
            .on_every_rank(&mut self.replicas, |_, r| r.step(lr, max_grad_norm))?;
        let stepped = Self::first_error(results).and_then(|stats| {
            self.gather_masters()?;
            Ok(stats)
        });
        match stepped {
            Ok(stats) => Ok(stats[0]),
            Err(DataParallelError::Rank { rank, source, .. }) => Err(DataParallelError::Update {
                rank,
                message: source.to_string(),
            }),
            Err(DataParallelError::Panicked { rank, message }) => {
                Err(DataParallelError::Update { rank, message })
            }
            Err(e) => Err(e),
        }
    }

    fn eval_loss(&self, batch: &E::Batch) -> Result<f32, Self::Error> {
        (self.first().eval_loss(batch)).map_err(|source| self.rank_error(0, source))
    }

    /// Batch `i` on rank `i mod ranks`, the ranks side by side (their weights are the same).
    fn eval_losses(&self, batches: &[E::Batch]) -> Result<Vec<f32>, Self::Error> {
        let ranks = self.replicas.len();
        let results = self
            .threads
            .on_every_rank(&self.replicas, |rank, replica| {
                (batches.iter().enumerate())
                    .filter(|(i, _)| i % ranks == rank)
                    .map(|(i, b)| replica.eval_loss(b).map(|l| (i, l)))
                    .collect::<Result<Vec<_>, _>>()
            })?;
        let mut losses: Vec<(usize, f32)> = Self::first_error(results)?.concat();
        losses.sort_by_key(|(i, _)| *i);
        Ok(losses.into_iter().map(|(_, l)| l).collect())
    }

    fn param_counts(&self) -> ParamCounts {
        self.first().param_counts()
    }

    /// Rank 0 writes: the replicas' weights are identical; under ZeRO-1 the optimizer file holds
    /// every rank's shard merged (the file of an unsharded run).
    fn save(&mut self, dir: &Path) -> Result<(), Self::Error> {
        (self.replicas[0].save(dir)).map_err(|source| self.rank_error(0, source))?;
        if self.shards.is_none() {
            return Ok(());
        }
        let mut merged = (self.replicas[0].optimizer_state()).map_err(|e| self.rank_error(0, e))?;
        for (rank, replica) in self.replicas.iter().enumerate().skip(1) {
            merged.absorb(
                replica
                    .optimizer_state()
                    .map_err(|e| self.rank_error(rank, e))?,
            );
        }
        (merged.save(&dir.join("optimizer.safetensors"))).map_err(|e| DataParallelError::Panicked {
            rank: 0,
            message: e.to_string(),
        })
    }

    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), Self::Error> {
        let shards = self.shards.clone();
        let results = self.threads.on_every_rank(&mut self.replicas, |rank, r| {
            r.load(dir, with_optimizer)?;
            match &shards {
                Some(masks) => r.keep_optimizer_states(&masks[rank]),
                None => Ok(()),
            }
        })?;
        Self::first_error(results).map(|_| ())
    }
}

impl<E> Generate for DataParallel<E>
where
    E: Replica + Generate + Sync,
    E::Batch: Sync,
{
    fn generate(
        &self,
        sources: &TokenRows,
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, Self::Error> {
        (self.first().generate(sources, config)).map_err(|source| self.rank_error(0, source))
    }
}

impl<E> Classify for DataParallel<E>
where
    E: Replica + Classify + Sync,
    E::Batch: Sync,
{
    fn labels(&self) -> Vec<String> {
        self.first().labels()
    }

    fn logits(&self, batch: &E::Batch) -> Result<Vec<f32>, Self::Error> {
        (self.first().logits(batch)).map_err(|source| self.rank_error(0, source))
    }
}

impl<E> Continue for DataParallel<E>
where
    E: Replica + Continue + Sync,
    E::Batch: Sync,
{
    fn continue_prompts(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, Self::Error> {
        (self.first().continue_prompts(prompts, config))
            .map_err(|source| self.rank_error(0, source))
    }
}
