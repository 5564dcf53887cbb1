//! AdamW's update of one chunk of laid-out f32 parameters as one launch: the masters and both
//! moments written in place, the step's scalars read from a small device tensor. A captured graph
//! replays its launches with the kernel arguments it was recorded with, so whatever changes from
//! step to step (the rate, the bias corrections, clipping's coefficient) must be tensor contents;
//! the betas and eps are a run's constants. Updating in place keeps each chunk in the buffer the
//! next step's launches read. flex runs the same arithmetic ([`adamw_element`], which the host
//! optimizer also calls), so the fused path is checked against the host one without a card.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;

use crate::kernels::flex_values::{into_values, values};
use crate::kernels::vectorised::with_avx512;

/// Where each of a step's scalars sits in the `[4]` tensor [`adamw_update`] reads.
pub mod scalar {
    /// The rate over the first moment's bias correction.
    pub const STEP_SIZE: usize = 0;
    /// `1 / sqrt(1 − beta2^t)`.
    pub const INV_BC2_SQRT: usize = 1;
    /// The decoupled decay `1 − lr · weight_decay`.
    pub const DECAY: usize = 2;
    /// Clipping's coefficient the gradient is multiplied by (1: no clipping).
    pub const GRAD_SCALE: usize = 3;
    pub const COUNT: usize = 4;
}

/// A run's AdamW constants, as f32 the way the update computes with them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConstants {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

/// One step's scalars (see [`scalar`]).
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub step_size: f32,
    pub inv_bc2_sqrt: f32,
    pub decay: f32,
    pub grad_scale: f32,
}

impl AdamWStep {
    /// The scalars laid out as [`adamw_update`] reads them.
    pub fn values(&self) -> [f32; scalar::COUNT] {
        let mut v = [0.0; scalar::COUNT];
        v[scalar::STEP_SIZE] = self.step_size;
        v[scalar::INV_BC2_SQRT] = self.inv_bc2_sqrt;
        v[scalar::DECAY] = self.decay;
        v[scalar::GRAD_SCALE] = self.grad_scale;
        v
    }

    fn from_values(s: &[f32]) -> Self {
        assert_eq!(
            s.len(),
            scalar::COUNT,
            "AdamW reads {} scalars",
            scalar::COUNT
        );
        Self {
            step_size: s[scalar::STEP_SIZE],
            inv_bc2_sqrt: s[scalar::INV_BC2_SQRT],
            decay: s[scalar::DECAY],
            grad_scale: s[scalar::GRAD_SCALE],
        }
    }
}

/// `torch.optim.AdamW`'s update of one element: the gradient `g` times the step's scale, then the
/// moments, then the weight. The host optimizer, flex and the kernel compute exactly this.
#[inline(always)]
pub fn adamw_element(
    c: AdamWConstants,
    s: &AdamWStep,
    (w, m, v): (&mut f32, &mut f32, &mut f32),
    g: f32,
) {
    let g = g * s.grad_scale;
    *m = c.beta1 * *m + (1.0 - c.beta1) * g;
    *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
    let denom = v.sqrt() * s.inv_bc2_sqrt + c.eps;
    *w = *w * s.decay - s.step_size * *m / denom;
}

#[backend_extension(Flex, Cube: cfg(cube_kernels))]
pub trait AdamWOp: Backend {
    /// AdamW over f32 chunks `w`, `m`, `v` (one shape) from the f32 gradient `g`, the step's
    /// scalars in `scalars` (`[4]`, laid out as [`scalar`]): the new `(w, m, v)`, in the inputs'
    /// buffers where they are not shared.
    #[allow(clippy::too_many_arguments)]
    fn adamw_update(
        w: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        scalars: FloatTensor<Self>,
        beta1: f32,
        beta2: f32,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// [`AdamWOp::adamw_update`] of one chunk: `[w, m, v]` taken by value (so that they are written in
/// place), the new ones returned.
pub fn adamw_update(
    c: AdamWConstants,
    [w, m, v]: [Tensor<1>; 3],
    g: Tensor<1>,
    scalars: &Tensor<1>,
) -> [Tensor<1>; 3] {
    for t in [&w, &m, &v, &g, scalars] {
        assert_eq!(t.dtype(), DType::F32, "AdamW's fused update is f32");
    }
    let (w, m, v) = <Dispatch as AdamWOp>::adamw_update(
        w.into_dispatch(),
        m.into_dispatch(),
        v.into_dispatch(),
        g.into_dispatch(),
        scalars.clone().into_dispatch(),
        c.beta1,
        c.beta2,
        c.eps,
    );
    [w, m, v].map(Tensor::from_dispatch)
}

/// Whether [`adamw_update`] runs on `device`: flex always; a cubecl device where memfit's kernels
/// are built and on (`super::on_cube`); elsewhere the optimizer composes burn's ops.
pub fn fused_update_on(device: &burn::prelude::Device) -> bool {
    *device == burn::prelude::Device::flex() || super::on_cube(device)
}

impl AdamWOp for Flex {
    fn adamw_update(
        w: FlexTensor,
        m: FlexTensor,
        v: FlexTensor,
        g: FlexTensor,
        scalars: FlexTensor,
        beta1: f32,
        beta2: f32,
        eps: f32,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let c = AdamWConstants { beta1, beta2, eps };
        let s = AdamWStep::from_values(&values(&scalars));
        let g = values(&g);
        let (mut wd, mut md, mut vd) = (into_values(w), into_values(m), into_values(v));
        {
            let w = wd.as_mut_slice::<f32>().expect("f32");
            let m = md.as_mut_slice::<f32>().expect("f32");
            let v = vd.as_mut_slice::<f32>().expect("f32");
            assert!(w.len() == g.len() && m.len() == g.len() && v.len() == g.len());
            with_avx512(|| {
                for (((w, m), v), &g) in w.iter_mut().zip(m).zip(v).zip(g.iter()) {
                    adamw_element(c, &s, (w, m, v), g);
                }
            });
        }
        let back = FlexTensor::from_data;
        (back(wd), back(md), back(vd))
    }
}

#[cfg(cube_kernels)]
mod cube {
    use burn::backend::Cube;
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::{calculate_cube_count_elemwise, prelude::*};
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;

    use super::{AdamWOp, scalar};

    /// [`super::adamw_element`] at every position; `one_minus_*` passed as the host rounds them.
    #[cube(launch_unchecked)]
    #[allow(clippy::too_many_arguments)]
    fn adamw_kernel(
        w: &mut Tensor<f32>,
        m: &mut Tensor<f32>,
        v: &mut Tensor<f32>,
        g: &Tensor<f32>,
        s: &Tensor<f32>,
        beta1: f32,
        one_minus_beta1: f32,
        beta2: f32,
        one_minus_beta2: f32,
        eps: f32,
    ) {
        let i = ABSOLUTE_POS;
        if i >= w.len() {
            terminate!();
        }
        let grad = g[i] * s[comptime!(scalar::GRAD_SCALE)];
        let m_new = beta1 * m[i] + one_minus_beta1 * grad;
        let v_new = beta2 * v[i] + one_minus_beta2 * grad * grad;
        let denom = f32::sqrt(v_new) * s[comptime!(scalar::INV_BC2_SQRT)] + eps;
        w[i] = w[i] * s[comptime!(scalar::DECAY)] - s[comptime!(scalar::STEP_SIZE)] * m_new / denom;
        m[i] = m_new;
        v[i] = v_new;
    }

    /// `t` contiguous and ours to write: itself when no other handle shares its buffer.
    fn writable(t: CubeTensor) -> CubeTensor {
        let t = into_contiguous(t);
        if t.can_mut() { t } else { t.copy() }
    }

    impl AdamWOp for Cube {
        fn adamw_update(
            w: CubeTensor,
            m: CubeTensor,
            v: CubeTensor,
            g: CubeTensor,
            scalars: CubeTensor,
            beta1: f32,
            beta2: f32,
            eps: f32,
        ) -> (CubeTensor, CubeTensor, CubeTensor) {
            let (w, m, v) = (writable(w), writable(m), writable(v));
            let (g, scalars) = (into_contiguous(g), into_contiguous(scalars));
            let n = w.meta.num_elements();
            let dim = CubeDim::new(&w.client, n);
            let count = calculate_cube_count_elemwise(&w.client, n, dim);
            unsafe {
                adamw_kernel::launch_unchecked(
                    &w.client,
                    count,
                    dim,
                    w.clone().into_tensor_arg(),
                    m.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    g.into_tensor_arg(),
                    scalars.into_tensor_arg(),
                    beta1,
                    1.0 - beta1,
                    beta2,
                    1.0 - beta2,
                    eps,
                );
            }
            (w, m, v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::device_op_devices;
    use burn::prelude::*;

    /// The fused update equals the element-wise one step for step, with the scalars changing every
    /// step (a frozen kernel scalar would keep the first), on flex and, built with `--features
    /// wgpu`, on cubecl's kernel.
    #[test]
    fn the_fused_update_equals_the_element_formula() {
        let c = AdamWConstants {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let n = 1000;
        let start = |k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7 + k) % 23) as f32 * 0.05 - 0.5)
                .collect()
        };
        let steps = [
            [0.05, 3.2, 0.999, 0.75],
            [0.02, 2.1, 0.998, 1.0],
            [0.08, 1.7, 0.997, 0.3],
        ];
        for device in device_op_devices() {
            let upload =
                |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
            let (mut w, mut m, mut v) = (start(0), vec![0.0f32; n], vec![0.0f32; n]);
            let mut dev = [upload(&w), upload(&m), upload(&v)];
            for (k, s) in steps.iter().enumerate() {
                let g = start(k + 1);
                let step = AdamWStep::from_values(s);
                for i in 0..n {
                    adamw_element(c, &step, (&mut w[i], &mut m[i], &mut v[i]), g[i]);
                }
                let scalars = Tensor::<1>::from_data(TensorData::new(s.to_vec(), [4]), &device);
                dev = adamw_update(c, dev, upload(&g), &scalars);
            }
            for (got, want) in dev.iter().zip([&w, &m, &v]) {
                let got = got.clone().into_data().try_to_vec::<f32>().unwrap();
                for (a, b) in got.iter().zip(want.iter()) {
                    assert!(
                        (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                        "{a} vs {b} on {device:?}"
                    );
                }
            }
        }
    }
}
