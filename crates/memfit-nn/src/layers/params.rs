//! What every family's parameter layout is made of: a parameter's transformers name, how it is
//! stored (memfit keeps linear weights `[in, out]`, transformers `[out, in]`), its module group and
//! its initialisation; and what a family does with a list of them (draw initial values, upload to a
//! device, write and read transformers' layout).

use std::borrow::Cow;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::kernels::dropout::SplitMix64;
use crate::weights::{NamedTensor, transpose};

/// How a parameter is stored in memory vs in a transformers checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `nn.Linear` weight: transformers stores `[out, in]`; memfit stores `[in, out]` so that
    /// `x.matmul(w)` needs no transpose.
    Linear { d_in: usize, d_out: usize },
    /// Stored as in transformers: `[rows, cols]` (embeddings, relative attention bias).
    Table { rows: usize, cols: usize },
    /// A 1-d parameter (norm weight, bias): `[d]` in transformers, `[1, d]` in memory.
    Vector { d: usize },
}

impl Kind {
    /// Shape in memory (always 2-D).
    pub fn shape(self) -> [usize; 2] {
        match self {
            Kind::Linear { d_in, d_out } => [d_in, d_out],
            Kind::Table { rows, cols } => [rows, cols],
            Kind::Vector { d } => [1, d],
        }
    }

    /// Shape in a transformers checkpoint.
    pub fn hf_shape(self) -> Vec<usize> {
        match self {
            Kind::Linear { d_in, d_out } => vec![d_out, d_in],
            Kind::Table { rows, cols } => vec![rows, cols],
            Kind::Vector { d } => vec![d],
        }
    }

    pub fn numel(self) -> usize {
        let [a, b] = self.shape();
        a * b
    }

    /// Values read in transformers' layout, in memory's.
    pub fn from_hf(self, values: Vec<f32>) -> Vec<f32> {
        match self {
            Kind::Linear { d_in, d_out } => transpose(&values, d_out, d_in),
            _ => values,
        }
    }
}

/// Initialisation, as the family's `PreTrainedModel._init_weights` does it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Ones,
    Zeros,
    Normal {
        std: f64,
    },
    /// An `nn.Embedding` with `padding_idx`: normal, then that row zeroed.
    NormalZeroRow {
        std: f64,
        row: usize,
    },
    /// Uniform in `[-bound, bound)` (`kaiming_uniform_`, as PEFT initialises LoRA's A).
    Uniform {
        bound: f64,
    },
}

impl Init {
    /// The initial values of parameter `index` (of `kind`) for `seed`: one generator stream per
    /// parameter, so adding a parameter does not shift the others.
    pub fn values(self, kind: Kind, seed: u64, index: usize) -> Vec<f32> {
        let n = kind.numel();
        let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let normal = |rng: &mut SplitMix64, std: f64| -> Vec<f32> {
            (0..n).map(|_| (rng.next_normal() * std) as f32).collect()
        };
        match self {
            Init::Ones => vec![1.0; n],
            Init::Zeros => vec![0.0; n],
            Init::Normal { std } => normal(&mut rng, std),
            Init::NormalZeroRow { std, row } => {
                let mut v = normal(&mut rng, std);
                let cols = kind.shape()[1];
                v[row * cols..(row + 1) * cols].fill(0.0);
                v
            }
            Init::Uniform { bound } => (0..n)
                .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                .collect(),
        }
    }
}

/// One parameter: transformers' tensor name, storage, module group `G` (for freezing), init.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec<G> {
    pub name: String,
    pub kind: Kind,
    pub group: G,
    pub init: Init,
}

/// Appends a parameter to `specs`; returns its index (how the forward pass refers to it).
pub fn push<G>(
    specs: &mut Vec<ParamSpec<G>>,
    name: String,
    kind: Kind,
    group: G,
    init: Init,
) -> usize {
    specs.push(ParamSpec {
        name,
        kind,
        group,
        init,
    });
    specs.len() - 1
}

/// Every parameter's initial values, in `specs` order.
pub fn init_all<G>(specs: &[ParamSpec<G>], seed: u64) -> Vec<Vec<f32>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.init.values(s.kind, seed, i))
        .collect()
}

/// Uploads every parameter to `device` as `dtype`, untracked.
pub fn upload<G>(
    specs: &[ParamSpec<G>],
    weights: &[Vec<f32>],
    device: &Device,
    dtype: DType,
) -> Vec<Tensor<2>> {
    specs
        .iter()
        .zip(weights)
        .map(|(spec, w)| {
            Tensor::from_data(
                TensorData::new(w.clone(), spec.kind.shape()),
                (device, dtype),
            )
        })
        .collect()
}

/// Weights in transformers' names and shapes (`[out, in]` for linear layers), transposed as they
/// are written, one tensor at a time.
pub fn hf_tensors<'a, G>(specs: &[ParamSpec<G>], weights: &'a [Vec<f32>]) -> Vec<NamedTensor<'a>> {
    specs
        .iter()
        .zip(weights)
        .map(|(spec, w)| NamedTensor {
            name: spec.name.clone(),
            shape: spec.kind.hf_shape(),
            values: Cow::Borrowed(w.as_slice()),
            transpose: match spec.kind {
                Kind::Linear { d_in, d_out } => Some([d_in, d_out]),
                _ => None,
            },
        })
        .collect()
}

/// Each parameter's name and shapes as an optimizer sees them.
pub fn shapes<G>(specs: &[ParamSpec<G>]) -> Vec<crate::model::ParamShape> {
    specs
        .iter()
        .map(|s| crate::model::ParamShape {
            name: s.name.clone(),
            hf_shape: s.kind.hf_shape(),
            transposed: matches!(s.kind, Kind::Linear { .. }),
            dims: s.kind.shape(),
        })
        .collect()
}

/// Total and trainable parameter counts; `trains(i)` says whether parameter `i` trains.
pub fn counts<G>(specs: &[ParamSpec<G>], trains: impl Fn(usize) -> bool) -> (u64, u64) {
    let mut total = 0u64;
    let mut trainable = 0u64;
    for (i, spec) in specs.iter().enumerate() {
        let n = spec.kind.numel() as u64;
        total += n;
        if trains(i) {
            trainable += n;
        }
    }
    (total, trainable)
}

/// Whether two layouts hold the same tensors (names and shapes, in order): weights of one fit the
/// other, whatever their init scales or other hyper-parameters.
pub fn same_tensors<G>(a: &[ParamSpec<G>], b: &[ParamSpec<G>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| a.name == b.name && a.kind == b.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_row_is_zero_and_the_rest_is_drawn() {
        let kind = Kind::Table { rows: 4, cols: 3 };
        let v = Init::NormalZeroRow { std: 1.0, row: 2 }.values(kind, 7, 0);
        assert!(v[6..9].iter().all(|x| *x == 0.0));
        assert!(v[..6].iter().chain(&v[9..]).all(|x| *x != 0.0));
        // The same stream as the plain normal init, apart from the zeroed row.
        let plain = Init::Normal { std: 1.0 }.values(kind, 7, 0);
        assert_eq!(v[..6], plain[..6]);
    }
}
