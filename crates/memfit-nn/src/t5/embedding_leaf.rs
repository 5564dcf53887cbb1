//! T5's shared embedding as the table of [`EmbeddingLeaf`]s (encoder and decoder inputs alike).

use burn::prelude::*;

pub use crate::layers::embedding_leaf::EmbeddingLeaf;
use crate::layers::embedding_leaf::EmbeddingTable;
use crate::t5::forward::T5Forward;

impl EmbeddingTable for T5Forward<'_> {
    fn embed_untracked(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        T5Forward::embed_untracked(self, ids)
    }

    fn table_index(&self) -> usize {
        self.layout.shared
    }
}
