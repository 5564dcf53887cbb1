//! Token embeddings as autodiff leaves cut from the table. burn's `select` back-propagates each
//! lookup into a dense `[vocab, d]` gradient (two per step: encoder and decoder) that autodiff then
//! sums into the table's: with a 30k vocabulary and d 768, 86 MiB per tensor at the peak of
//! backward. Here the lookup runs without autodiff, its `[b, t, d]` result is the leaf, and the
//! leaf's gradient goes row by row into the table's accumulated gradient ([`GradSink::rows`]).

use burn::prelude::*;
use burn::tensor::Gradients;

use crate::layers::grad_sink::GradSink;
use crate::t5::forward::T5Forward;

/// The embeddings of one id tensor as an autodiff leaf, and the ids it holds rows of.
pub struct EmbeddingLeaf {
    /// `[b, t, d]` in the activation dtype; retains its gradient when the table trains.
    pub input: Tensor<3>,
    ids: Vec<usize>,
    table: usize,
}

impl EmbeddingLeaf {
    /// Looks `ids` up in `fwd`'s embedding table; the leaf requires a gradient when `trains`.
    pub fn new(fwd: &T5Forward, ids: Tensor<2, Int>, trains: bool) -> Self {
        let host: Vec<i64> = ids
            .to_data()
            .convert::<i64>()
            .try_to_vec()
            .expect("i64 ids");
        let rows = fwd.embed_untracked(ids).autodiff();
        Self {
            input: if trains { rows.require_grad() } else { rows },
            ids: host.into_iter().map(|id| id as usize).collect(),
            table: fwd.layout.shared,
        }
    }

    /// Hands the leaf's gradient in `grads` (none when the table is frozen or the leaf was not
    /// reached) to `sink` as rows of the table.
    pub fn backward<E>(
        &self,
        grads: &mut Gradients,
        sink: &mut dyn GradSink<Error = E>,
    ) -> Result<(), E> {
        match self.input.grad_remove(grads) {
            Some(g) => {
                let [b, t, d] = g.dims();
                sink.rows(self.table, &self.ids, g.reshape([b * t, d]))
            }
            None => Ok(()),
        }
    }
}
