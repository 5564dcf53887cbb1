//! Token embeddings as autodiff leaves cut from the table. burn's `select` back-propagates each
//! lookup into a dense `[vocab, d]` gradient that autodiff then sums into the table's: with a 30k
//! vocabulary and d 768, 86 MiB per lookup at the peak of backward (a 151k vocabulary: 4× that).
//! Here the lookup runs without autodiff, its `[b, t, d]` result is the leaf, and the leaf's
//! gradient goes row by row into the table's accumulated gradient ([`GradSink::rows`]).

use burn::prelude::*;
use burn::tensor::Gradients;

use crate::layers::grad_sink::GradSink;

/// A family's embedding table, as a leaf needs it.
pub trait EmbeddingTable {
    /// The embeddings of `ids` `[b, t]` in the activation dtype, looked up without autodiff.
    fn embed_untracked(&self, ids: Tensor<2, Int>) -> Tensor<3>;
    /// The table's index among the parameters (where its gradient rows go).
    fn table_index(&self) -> usize;
}

/// The embeddings of one id tensor as an autodiff leaf, and the ids it holds rows of (when the
/// table trains).
pub struct EmbeddingLeaf {
    /// `[b, t, d]` in the activation dtype; retains its gradient when the table trains.
    pub input: Tensor<3>,
    ids: Vec<usize>,
    table: usize,
}

impl EmbeddingLeaf {
    /// Looks `ids` up in `fwd`'s embedding table; the leaf requires a gradient when `trains`.
    /// `host_ids` are the same ids as the host made them: the rows a gradient goes to are read
    /// from there, since reading the device tensor back would wait for the device to finish every
    /// kernel queued before it.
    pub fn new(
        fwd: &impl EmbeddingTable,
        ids: Tensor<2, Int>,
        host_ids: &[u32],
        trains: bool,
    ) -> Self {
        debug_assert_eq!(ids.dims().iter().product::<usize>(), host_ids.len());
        let rows = fwd.embed_untracked(ids).autodiff();
        Self {
            input: if trains { rows.require_grad() } else { rows },
            ids: if trains {
                host_ids.iter().map(|&id| id as usize).collect()
            } else {
                Vec::new()
            },
            table: fwd.table_index(),
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
