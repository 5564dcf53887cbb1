//! LoRA (Hu et al. 2021) as PEFT computes it: a frozen linear layer plus a trained low-rank update,
//! `x·W + dropout(x)·A·B·scale` with `scale = alpha / r` (`alpha / √r` under rsLoRA). The update is
//! never materialised as a dense `W + A·B`: burn's own `apply_lora` does that and autodiff then
//! keeps the merged matrix and a weight-sized gradient per layer (docs/architecture.md §6), the memory LoRA
//! exists to save. Here only A `[in, r]` and B `[r, out]` are tracked; W is read, not kept.
//!
//! Layout: memfit stores A as `[in, r]` and B as `[r, out]` (linear weights are `[in, out]`);
//! PEFT's `lora_A.weight` is `[r, in]` and `lora_B.weight` `[out, r]`, the same transposition as
//! every other linear weight ([`Kind::Linear`]).

use burn::prelude::*;
use burn::tensor::DType;

use crate::ModelError;
use crate::kernels::dropout::Dropout;
use crate::kernels::dropout_linear_op::dropout_linear;
use crate::kernels::gemm_bf16::Products;
use crate::kernels::linear_op;
use crate::layers::params::{Init, Kind};

/// The hyper-parameters of one adapter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraSettings {
    /// The rank.
    pub r: usize,
    pub alpha: f64,
    /// Dropout on the adapter's input (training only).
    pub dropout: f64,
    /// rsLoRA's scale `alpha / √r` instead of `alpha / r`.
    pub use_rslora: bool,
}

impl Default for LoraSettings {
    /// The defaults: r 16, alpha 32, dropout 0.05.
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.05,
            use_rslora: false,
        }
    }
}

impl LoraSettings {
    /// What the update `A·B` is multiplied by.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Checks the values (named as the CLI's flags).
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.r == 0 {
            return Err(ModelError::Input("--lora-r 0: the rank must be > 0".into()));
        }
        if !self.alpha.is_finite() || self.alpha <= 0.0 {
            return Err(ModelError::Input(format!(
                "--lora-alpha {}: must be > 0",
                self.alpha
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::Input(format!(
                "--lora-dropout {}: must be in [0, 1)",
                self.dropout
            )));
        }
        Ok(())
    }

    /// A's and B's storage for a layer of `[d_in, d_out]`.
    pub fn kinds(&self, d_in: usize, d_out: usize) -> (Kind, Kind) {
        (
            Kind::Linear {
                d_in,
                d_out: self.r,
            },
            Kind::Linear {
                d_in: self.r,
                d_out,
            },
        )
    }
}

/// PEFT's initialisation: A `kaiming_uniform_(a=√5)` — uniform in ±√(6 / ((1 + a²)·fan_in)) =
/// ±1/√in — and B zeros, so a fresh adapter leaves the model unchanged.
pub fn inits(d_in: usize) -> (Init, Init) {
    (
        Init::Uniform {
            bound: 1.0 / (d_in as f64).sqrt(),
        },
        Init::Zeros,
    )
}

/// One adapter's tensors on a device: A `[in, r]`, B `[r, out]` (tracked when they train).
#[derive(Clone)]
pub struct Adapter {
    pub a: Tensor<2>,
    pub b: Tensor<2>,
    pub scale: f64,
}

impl Adapter {
    /// `dropout(x)·A·scale·B` for `x` `[n, in]`, in x's dtype: the scale multiplies the narrow
    /// `[n, r]` product. A's product keeps x itself, not a dropped copy (the mask is drawn again in
    /// backward: [`crate::kernels::dropout_linear_op`]), so the adapters reading one input (q, k, v; gate, up)
    /// keep one buffer between them; the frozen layer's product keeps none.
    pub fn delta(&self, x: Tensor<2>, drop: &mut Dropout, products: Products) -> Tensor<2> {
        let down = match drop.next_mask_for(&x) {
            Some((seed, p)) => dropout_linear(x, self.a.clone(), seed, p, products),
            None => linear_op::layer(drop.apply(x), self.a.clone(), products),
        };
        linear_op::layer(down * self.scale, self.b.clone(), products)
    }
}

/// `x·W + dropout(x)·A·B·scale` for `x` `[n, in]` and a frozen `W` `[in, out]` (f32 or bf16:
/// a bf16 W is multiplied with bf16 products, reading it where it lies).
pub fn frozen_plus_adapter(
    x: Tensor<2>,
    weight: Tensor<2>,
    adapter: Option<&Adapter>,
    drop: &mut Dropout,
    products: Products,
) -> Tensor<2> {
    let base_products = match weight.dtype() {
        DType::BF16 => Products::Bf16,
        _ => products,
    };
    let out = linear_op::layer(x.clone(), weight, base_products);
    match adapter {
        Some(adapter) => out + adapter.delta(x, drop, products),
        None => out,
    }
}

/// `W += A·B·scale` on host buffers in memfit's layout (`w` `[in, out]`, `a` `[in, r]`, `b`
/// `[r, out]`), in f64 sums: the merged weight PEFT's `merge_and_unload` writes.
pub fn merge_into(w: &mut [f32], a: &[f32], b: &[f32], r: usize, scale: f64) {
    let out = b.len() / r.max(1);
    for (w_row, a_row) in w.chunks_exact_mut(out).zip(a.chunks_exact(r)) {
        for (j, w) in w_row.iter_mut().enumerate() {
            let sum: f64 = a_row
                .iter()
                .enumerate()
                .map(|(k, &a)| a as f64 * b[k * out + j] as f64)
                .sum();
            *w = (*w as f64 + sum * scale) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{assert_close, pattern, values};
    use burn::tensor::TensorData;

    fn tensor(v: Vec<f32>, shape: [usize; 2]) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v, shape), &Device::flex())
    }

    #[test]
    fn gradients_of_a_and_b_are_the_dense_formulas() {
        // L = Σ G ⊙ (x·(W + s·A·B)): dA = s·xᵀ·G·Bᵀ, dB = s·(x·A)ᵀ·G, W gets none.
        let (n, d_in, r, d_out, s) = (5, 6, 2, 7, 0.75);
        let x = tensor(pattern(n * d_in, 1), [n, d_in]);
        let w = tensor(pattern(d_in * d_out, 2), [d_in, d_out]).autodiff();
        let a = tensor(pattern(d_in * r, 3), [d_in, r]);
        let b = tensor(pattern(r * d_out, 4), [r, d_out]);
        let g = tensor(pattern(n * d_out, 5), [n, d_out]);
        let adapter = Adapter {
            a: a.clone().autodiff().require_grad(),
            b: b.clone().autodiff().require_grad(),
            scale: s,
        };
        let mut drop = Dropout::disabled();
        let y = frozen_plus_adapter(
            x.clone(),
            w.clone(),
            Some(&adapter),
            &mut drop,
            Products::F32,
        );
        let grads = (y.clone() * g.clone()).sum().backward();
        let dense = x
            .clone()
            .matmul(w.clone().inner() + a.clone().matmul(b.clone()) * s);
        assert_close("y", &values(y.inner()), &values(dense), 1e-5);
        let da = x
            .clone()
            .transpose()
            .matmul(g.clone())
            .matmul(b.transpose())
            * s;
        let db = x.matmul(a).transpose().matmul(g) * s;
        assert_close(
            "dA",
            &values(adapter.a.grad(&grads).unwrap()),
            &values(da),
            1e-5,
        );
        assert_close(
            "dB",
            &values(adapter.b.grad(&grads).unwrap()),
            &values(db),
            1e-5,
        );
        assert!(
            w.grad(&grads).is_none(),
            "the frozen weight gets no gradient"
        );
    }

    #[test]
    fn merging_adds_the_scaled_product() {
        let (d_in, r, d_out, s) = (3, 2, 4, 2.0);
        let (a, b) = (pattern(d_in * r, 1), pattern(r * d_out, 2));
        let mut w = pattern(d_in * d_out, 3);
        let want = values(
            tensor(w.clone(), [d_in, d_out])
                + tensor(a.clone(), [d_in, r]).matmul(tensor(b.clone(), [r, d_out])) * s,
        );
        merge_into(&mut w, &a, &b, r, s);
        assert_close("merged", &w, &want, 1e-6);
    }

    #[test]
    fn peft_init_leaves_the_layer_unchanged_and_bounds_a() {
        let (ia, ib) = inits(16);
        let settings = LoraSettings::default();
        let (ka, kb) = settings.kinds(16, 8);
        let a = ia.values(ka, 1, 0);
        assert!(a.iter().all(|v| v.abs() <= 0.25) && a.iter().any(|v| v.abs() > 0.1));
        assert!(ib.values(kb, 1, 1).iter().all(|v| *v == 0.0));
        assert_eq!(settings.scale(), 2.0);
        let rs = LoraSettings {
            use_rslora: true,
            ..settings
        };
        assert_eq!(rs.scale(), 8.0);
    }
}
