//! Pieces families share: parameter layouts (names, storage, init), activations, attention masks,
//! where parameter gradients are collected, and the token cross-entropy over non-padding targets.

pub mod activation;
pub mod grad_sink;
pub mod loss;
pub mod mask;
pub mod params;
