//! GFLOP/s of the bf16 and f32 products on a linear layer's three shapes (forward `x · w`, the
//! input gradient `g · wᵀ`, the weight gradient `xᵀ · g`), one thread:
//! `cargo run --release -p memfit-nn --example gemm_rate -- [m k n] [bf16]` (default bert-base's
//! 1024 × 768 × 3072; `bf16` alone times the bf16 products only).

use std::time::Instant;

use burn::backend::Flex;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;
use memfit_nn::kernels::flex_values::cast;
use memfit_nn::kernels::gemm_bf16::Products;

fn tensor(rows: usize, cols: usize, dtype: DType) -> FlexTensor {
    let values = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0)
        .collect();
    cast(
        FlexTensor::from_data(TensorData::new(values, [rows, cols])),
        dtype,
    )
}

fn rate(label: &str, flops: f64, f: impl Fn() -> FlexTensor) {
    f();
    // the fastest of several: this box is shared, and noise only ever adds time
    let secs = (0..9)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    println!(
        "{label:<28} {:>8.2} ms {:>8.1} GFLOP/s",
        secs * 1e3,
        flops / secs / 1e9
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only_bf16 = args.iter().any(|a| a == "bf16");
    let dims: Vec<usize> = args
        .iter()
        .filter(|a| *a != "bf16")
        .map(|a| a.parse().expect("m k n"))
        .collect();
    let (m, k, n) = match dims[..] {
        [m, k, n] => (m, k, n),
        _ => (1024, 768, 3072),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    let flops = 2.0 * (m * k * n) as f64;
    let mut kinds = vec![(Products::F32, DType::F32), (Products::Bf16, DType::BF16)];
    if only_bf16 {
        kinds.remove(0);
    }
    for (products, act) in kinds {
        let (x, w, g) = (
            tensor(m, k, act),
            tensor(k, n, DType::F32),
            tensor(m, n, act),
        );
        let name = format!("{products:?}");
        rate(&format!("{name} x·w"), flops, || products.matmul(&x, &w));
        rate(&format!("{name} g·wᵀ"), flops, || {
            products.matmul(&g, &Flex::float_transpose(w.clone()))
        });
        rate(&format!("{name} xᵀ·g"), flops, || {
            products.matmul(&Flex::float_transpose(x.clone()), &g)
        });
    }
}
