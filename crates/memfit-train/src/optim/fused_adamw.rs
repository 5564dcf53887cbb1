//! AdamW's update of one parameter as one cubecl kernel (CUDA, wgpu): it reads the master weight,
//! the gradient and both moments once and writes the weight and the moments in place. The same
//! update in burn's ops (what [`super::device`] runs elsewhere) is 13 kernels, each a pass over a
//! tensor, and a step runs it for every trained tensor: a BERT-base step launched 2,600 kernels for
//! its optimizer alone, where this launches 200. The arithmetic is the ops', term for term.

use burn::backend::{BackendTensor, DispatchAutodiffContext, DispatchTensor, DispatchTensorKind};
use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::CubeDim;

/// The update's coefficients, as [`super::device`]'s AdamW derives them for one step.
pub struct AdamWTerms {
    /// Clipping's coefficient, applied to the gradient first.
    pub grad_scale: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// `1 − lr · weight_decay`.
    pub decay: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `1 / √(1 − β₂ᵗ)`.
    pub inv_bc2_sqrt: f32,
}

mod kernel {
    use cubecl::prelude::*;

    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn adamw_kernel(
        w: &Tensor<f32>,
        m: &Tensor<f32>,
        v: &Tensor<f32>,
        g: &Tensor<f32>,
        w_out: &mut Tensor<f32>,
        m_out: &mut Tensor<f32>,
        v_out: &mut Tensor<f32>,
        grad_scale: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        decay: f32,
        step_size: f32,
        inv_bc2_sqrt: f32,
    ) {
        let i = ABSOLUTE_POS;
        if i < w.len() {
            let gi = g[i] * grad_scale;
            let mi = m[i] * beta1 + gi * (1.0 - beta1);
            let vi = v[i] * beta2 + gi * gi * (1.0 - beta2);
            let denom = f32::sqrt(vi) * inv_bc2_sqrt + eps;
            w_out[i] = w[i] * decay - mi / denom * step_size;
            m_out[i] = mi;
            v_out[i] = vi;
        }
    }
}

/// `[w, m, v]` updated by one kernel where all four tensors are plain f32 cubecl tensors stored
/// contiguously and `w`, `m`, `v` are held nowhere else (the update writes them in place); else
/// the three back untouched, for the ops.
pub fn step(
    [w, m, v]: [Tensor<2>; 3],
    g: &Tensor<2>,
    t: &AdamWTerms,
) -> Result<[Tensor<2>; 3], [Tensor<2>; 3]> {
    let all = [w, m, v, g.clone()];
    if !all.iter().all(|x| x.dtype() == DType::F32) {
        let [w, m, v, _] = all;
        return Err([w, m, v]);
    }
    let cube = all.map(into_cube);
    let usable = cube.iter().all(|c| matches!(c, Ok(c) if c.is_contiguous()))
        && cube[..3]
            .iter()
            .all(|c| matches!(c, Ok(c) if c.handle.can_mut()));
    if !usable {
        let [w, m, v, _] = cube.map(|c| c.map_or_else(|t| t, from_cube));
        return Err([w, m, v]);
    }
    let [w, m, v, g] = cube.map(|c| c.ok().expect("checked above"));
    let n = w.meta.num_elements();
    let client = w.client.clone();
    let cube_dim = CubeDim::new(&client, n);
    let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
    kernel::adamw_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        w.clone().into_tensor_arg(),
        m.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        g.into_tensor_arg(),
        // written in place: each output is the input at that position
        w.as_tensor_alias(0),
        m.as_tensor_alias(1),
        v.as_tensor_alias(2),
        t.grad_scale,
        t.beta1,
        t.beta2,
        t.eps,
        t.decay,
        t.step_size,
        t.inv_bc2_sqrt,
    );
    // Submitted at once. On wgpu, 41 of these queued back to back (a BERT step) and submitted
    // together with the ops around them left BERT's run 1e-4 off the host's by step 10 in 8 of 8
    // runs; flushed one by one, 0 of 8 (docs/gpu.md, "Optimizer"). What cubecl-wgpu does
    // differently with the batch was not found.
    let _ = client.flush();
    Ok([w, m, v].map(from_cube))
}

/// `t`'s cubecl tensor, where it is one (and not tracked by autodiff); else `t` back.
fn into_cube(t: Tensor<2>) -> Result<CubeTensor, Tensor<2>> {
    let DispatchTensor { kind, autodiff } = t.into_dispatch();
    match (kind, autodiff) {
        (DispatchTensorKind::Cube(BackendTensor::Float(c)), DispatchAutodiffContext::Disabled) => {
            Ok(c)
        }
        (kind, autodiff) => Err(Tensor::from_dispatch(DispatchTensor { kind, autodiff })),
    }
}

fn from_cube(c: CubeTensor) -> Tensor<2> {
    Tensor::from_dispatch(DispatchTensor {
        kind: DispatchTensorKind::Cube(BackendTensor::Float(c)),
        autodiff: DispatchAutodiffContext::Disabled,
    })
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn terms() -> AdamWTerms {
        AdamWTerms {
            grad_scale: 0.5,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            decay: 1.0 - 1e-3 * 0.01,
            step_size: 1e-3 / (1.0 - 0.9f32.powi(3)),
            inv_bc2_sqrt: 1.0 / (1.0 - 0.999f32.powi(3)).sqrt(),
        }
    }

    /// The update in burn's ops, as `device::adamw` runs it off cubecl.
    fn in_ops([w, m, v]: [Tensor<2>; 3], g: Tensor<2>, t: &AdamWTerms) -> [Tensor<2>; 3] {
        let g = g.mul_scalar(t.grad_scale);
        let m = m.mul_scalar(t.beta1) + g.clone().mul_scalar(1.0 - t.beta1);
        let v = v.mul_scalar(t.beta2) + (g.clone() * g).mul_scalar(1.0 - t.beta2);
        let denom = v
            .clone()
            .sqrt()
            .mul_scalar(t.inv_bc2_sqrt)
            .add_scalar(t.eps);
        let w = w.mul_scalar(t.decay) - (m.clone() / denom).mul_scalar(t.step_size);
        [w, m, v]
    }

    fn random(device: &Device) -> [Tensor<2>; 4] {
        let normal = Distribution::Normal(0.0, 1.0);
        let v = Tensor::<2>::random([33, 70], Distribution::Uniform(0.0, 1.0), device);
        let [w, m, g] = [0; 3].map(|_| Tensor::<2>::random([33, 70], normal, device));
        [w, m, v, g]
    }

    #[test]
    fn one_kernel_updates_as_the_ops_do() {
        let device = Device::wgpu(Default::default());
        let [w, m, v, g] = random(&device);
        let expected = in_ops([w.clone(), m.clone(), v.clone()], g.clone(), &terms());
        // copies of their own, so that the kernel may write them in place
        let own = |t: &Tensor<2>| t.clone().mul_scalar(1.0);
        let updated = step([own(&w), own(&m), own(&v)], &g, &terms());
        let updated = updated.unwrap_or_else(|_| panic!("a wgpu tensor takes the kernel"));
        // the same terms in the same order: equal but for a fused multiply-add here and there
        for (got, want) in updated.into_iter().zip(expected) {
            let values = |t: Tensor<2>| t.into_data().to_vec::<f32>().unwrap();
            for (a, b) in values(got).into_iter().zip(values(want)) {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-6), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn a_shared_or_host_tensor_is_handed_back_untouched() {
        let device = Device::wgpu(Default::default());
        let [w, m, v, g] = random(&device);
        let before = m.clone().into_data();
        // `m` is held here as well: writing it in place would change this copy
        let back = step(
            [w.mul_scalar(1.0), m.clone(), v.mul_scalar(1.0)],
            &g,
            &terms(),
        );
        assert!(back.is_err());
        m.into_data().assert_eq(&before, true);
        let [w, m, v, g] = random(&Device::flex());
        assert!(step([w, m, v], &g, &terms()).is_err());
    }
}
