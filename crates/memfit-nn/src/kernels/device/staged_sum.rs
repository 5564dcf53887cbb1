//! The sum of every value of a device tensor, reduced in stages of 256 along rows. burn-cubecl's
//! whole-tensor `sum` is wrong past a size on wgpu (measured there: a 1-D sum stops at 262,132 from
//! 2^18 ones on, a 2-D one drops rows from 2^24 values on), and the optimizer sums tensors of up
//! to 2^24 values (a laid-out chunk, T5's embedding): the gradient norm that clipping reads came out
//! 1.06 for a true 2.28. Reductions along a dimension of 256 are right at every size. The engine's
//! norms and Adafactor's RMS use it, and the LM head's loss over a chunk's rows.

use burn::prelude::*;

/// Values per row of each stage.
const STAGE: usize = 256;

/// Σ of all of `t`'s values as a one-element tensor (nothing is read back).
pub fn staged_sum<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    let mut flat: Tensor<1> = t.reshape([n]);
    while flat.dims()[0] > STAGE {
        let n = flat.dims()[0];
        let rows = n.div_ceil(STAGE);
        if rows * STAGE != n {
            let pad = Tensor::zeros([rows * STAGE - n], (&flat.device(), flat.dtype()));
            flat = Tensor::cat(vec![flat, pad], 0);
        }
        flat = flat.reshape([rows, STAGE]).sum_dim(1).reshape([rows]);
    }
    flat.sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::device_op_devices;

    fn sum_of_ones(n: usize, device: &Device) -> f32 {
        let t = Tensor::<1>::ones([n], device);
        staged_sum(t).into_data().try_to_vec::<f32>().unwrap()[0]
    }

    /// Exact for sizes on both sides of a stage and past the sizes where cubecl's own sum fails;
    /// built with `--features wgpu`, on cubecl's kernels too (where the failure was measured).
    #[test]
    fn sums_every_value_at_every_size() {
        for device in device_op_devices() {
            for n in [1, 255, 256, 257, 65_537, 1 << 18, 17 << 20] {
                assert_eq!(sum_of_ones(n, &device), n as f32, "{n} ones on {device:?}");
            }
        }
        let t = Tensor::<2>::from_data([[1.5f32, -2.0], [3.0, 0.25]], &Device::flex());
        assert_eq!(
            staged_sum(t).into_data().try_to_vec::<f32>().unwrap(),
            [2.75]
        );
    }
}
