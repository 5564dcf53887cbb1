//! Pieces a family's forward pass and loss share: where parameter gradients are collected, and the
//! token cross-entropy over non-padding targets.

pub mod grad_sink;
pub mod loss;
