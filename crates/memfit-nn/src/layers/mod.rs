//! Pieces families share: parameter layouts (names, storage, init), activations, attention masks,
//! where parameter gradients are collected, the token cross-entropy over non-padding targets, and
//! tensors to and from host memory.

pub mod activation;
pub mod chunked_head;
pub mod embedding_leaf;
pub mod grad_sink;
pub mod host;
pub mod lora;
pub mod loss;
pub mod mask;
pub mod params;
pub mod segments;
