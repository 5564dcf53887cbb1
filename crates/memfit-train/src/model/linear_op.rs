//! A linear layer's `x · w` as one operation with a hand-written backward, each product one `gemm`
//! call writing straight into the output's buffer: a burn backend extension for the flex CPU
//! backend, in f32.
//!
//! burn-flex's matmul allocates every output twice: a zero-filled byte vector, then (to align it)
//! a copy of it, before `gemm` writes the result: two extra passes over, and a transient second
//! copy of, every activation and gradient a linear layer makes. Here the output is allocated once,
//! uninitialised, and `gemm` (the crate burn-flex calls) fills it. Inputs are read in place,
//! strided views included. The backward is the usual `dx = g · wᵀ`, `dw = xᵀ · g`; it keeps x and
//! w, as burn's matmul does.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;

#[backend_extension(Flex, Autodiff)]
pub trait LinearOp: Backend {
    /// `x · w`: x `[m, k]`, w `[k, n]`, both 2-d (any strides).
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Whether [`linear`] runs for `x` (flex, f32); other backends and dtypes use burn's matmul.
pub fn supported(x: &Tensor<2>) -> bool {
    x.dtype() == DType::F32 && x.device() == Device::flex()
}

/// [`LinearOp::linear`] on tensors (see [`supported`]).
pub fn linear(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as LinearOp>::linear(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

impl LinearOp for Flex {
    fn linear(x: FlexTensor, w: FlexTensor) -> FlexTensor {
        product(Matrix::of(&x), Matrix::of(&w))
    }
}

impl<C: CheckpointStrategy> LinearOp for Autodiff<Flex, C> {
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear;

        impl Backward<Flex, 2> for Linear {
            /// The input and the weight (shared with their producers: no copy).
            type State = (FlexTensor, FlexTensor);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [x_node, w_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let (x, w) = ops.state;
                if let Some(node) = w_node {
                    let dw = product(Matrix::of(&x).transposed(), Matrix::of(&grad));
                    grads.register::<Flex>(node.id, dw);
                }
                if let Some(node) = x_node {
                    let dx = product(Matrix::of(&grad), Matrix::of(&w).transposed());
                    grads.register::<Flex>(node.id, dx);
                }
            }
        }

        match Linear
            .prepare::<C>([x.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (x, w) = (x.into_primitive(), w.into_primitive());
                let out = Flex::linear(x.clone(), w.clone());
                prep.finish((x, w), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(Flex::linear(x.into_primitive(), w.into_primitive()))
            }
        }
    }
}

/// A 2-d f32 tensor read in place: its buffer, first element, shape and strides (in elements).
struct Matrix<'a> {
    data: &'a [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a> Matrix<'a> {
    fn of(t: &'a FlexTensor) -> Self {
        assert_eq!(t.dtype(), DType::F32, "the linear op runs in f32");
        let layout = t.layout();
        let (shape, strides) = (layout.shape(), layout.strides());
        assert_eq!(shape.num_dims(), 2, "the linear op takes 2-d tensors");
        Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            rows: shape[0],
            cols: shape[1],
            row_stride: strides[0],
            col_stride: strides[1],
        }
    }

    /// The same buffer read as the transpose (no copy).
    fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    fn ptr(&self) -> *const f32 {
        self.data[self.offset..].as_ptr()
    }

    /// The buffer covers every element the shape and strides address.
    fn check_bounds(&self) {
        if self.rows == 0 || self.cols == 0 {
            return;
        }
        let last = self.offset as isize
            + (self.rows as isize - 1) * self.row_stride
            + (self.cols as isize - 1) * self.col_stride;
        assert!(
            self.row_stride >= 0 && self.col_stride >= 0 && (last as usize) < self.data.len(),
            "matrix view outside its buffer"
        );
    }
}

/// Products at least this large (m·n·k) use the rayon pool: burn-flex's threshold.
const PARALLEL_MIN: usize = 192 * 192 * 192;

/// `a · b` as a new row-major tensor, written once by `gemm`.
fn product(a: Matrix, b: Matrix) -> FlexTensor {
    assert_eq!(a.cols, b.rows, "inner dimensions of a product");
    a.check_bounds();
    b.check_bounds();
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let parallelism = if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let mut out = Vec::<f32>::with_capacity(m * n);
    // SAFETY: both inputs lie inside their buffers (checked above) and outlive the call; `out` has
    // room for m·n elements. With `read_dst` false gemm never reads the destination (it sets the
    // destination's factor to zero and overwrites; k = 0 writes zeros), so it initialises all m·n
    // elements before `set_len`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.ptr(),
            a.col_stride,
            a.row_stride,
            b.ptr(),
            b.col_stride,
            b.row_stride,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
        out.set_len(m * n);
    }
    FlexTensor::from_data(TensorData::new(out, [m, n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: [usize; 2], salt: usize) -> Tensor<2> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|i| (((i + salt) * 7919 % 211) as f32 - 105.0) / 40.0)
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Device::flex())
            .autodiff()
            .require_grad()
    }

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec().unwrap()
    }

    /// Output and gradients of (x, w) through `f`; x is given transposed (a strided view) when
    /// `strided`.
    fn run(strided: bool, f: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> [Vec<f32>; 3] {
        let (x, w) = if strided {
            (tensor([6, 5], 1), tensor([6, 300], 2))
        } else {
            (tensor([5, 6], 1), tensor([6, 300], 2))
        };
        let input = if strided { x.clone().transpose() } else { x.clone() };
        let out = f(input, w.clone());
        let weight = tensor([5, 300], 3).inner();
        let grads = (out.clone() * weight).sum().backward();
        [
            values(out.inner()),
            values(x.grad(&grads).unwrap()),
            values(w.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_burns_matmul_in_value_and_gradients() {
        for strided in [false, true] {
            let fused = run(strided, |x, w| {
                assert!(supported(&x));
                linear(x, w)
            });
            let reference = run(strided, |x, w| x.matmul(w));
            for (which, (a, b)) in ["output", "dx", "dw"].iter().zip(fused.iter().zip(&reference)) {
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{which}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn large_products_use_the_pool_and_agree() {
        // m·n·k above the parallel threshold.
        let (x, w) = (tensor([256, 192], 4).inner(), tensor([192, 200], 5).inner());
        let fused = values(linear(x.clone(), w.clone()));
        let reference = values(x.matmul(w));
        for (a, b) in fused.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let x = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [3, 0]), &Device::flex());
        let w = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [0, 4]), &Device::flex());
        assert_eq!(values(linear(x, w)), vec![0.0; 12]);
    }
}
