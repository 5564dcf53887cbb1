use super::*;
use crate::kernels::flex_values::bf16_bits;
use crate::kernels::test_tensors::pattern;
use burn::backend::Flex;
use burn::backend::ops::FloatTensorOps;

fn tensor(shape: &[usize], salt: usize, dtype: DType) -> FlexTensor {
    let values = pattern(shape.iter().product(), salt);
    cast(
        FlexTensor::from_data(TensorData::new(values, shape.to_vec())),
        dtype,
    )
}

/// `a · b` in f64 over the bf16-rounded operands (contiguous copies), with Σ|a||b| per element
/// for the error bound.
fn reference(a: &FlexTensor, b: &FlexTensor) -> (Vec<f64>, Vec<f64>) {
    let round = |t: &FlexTensor| {
        let t = in_f32(cast(t.clone(), DType::BF16)).to_contiguous();
        let dims = t.layout().shape().num_dims();
        let shape = t.layout().shape().clone();
        (
            t.as_slice::<f32>().unwrap().to_vec(),
            shape[dims - 2],
            shape[dims - 1],
        )
    };
    let ((av, m, k), (bv, _, n)) = (round(a), round(b));
    let count = av.len() / (m * k).max(1);
    let (mut out, mut abs) = (vec![0.0; count * m * n], vec![0.0; count * m * n]);
    for i in 0..count {
        for r in 0..m {
            for c in 0..n {
                for p in 0..k {
                    let (x, y) = (
                        av[i * m * k + r * k + p] as f64,
                        bv[i * k * n + p * n + c] as f64,
                    );
                    out[i * m * n + r * n + c] += x * y;
                    abs[i * m * n + r * n + c] += (x * y).abs();
                }
            }
        }
    }
    (out, abs)
}

fn check(product: FlexTensor, a: &FlexTensor, b: &FlexTensor, what: &str) {
    let (expected, abs) = reference(a, b);
    let got = product.as_slice::<f32>().unwrap().to_vec();
    assert_eq!(got.len(), expected.len(), "{what}: size");
    for (j, ((g, e), s)) in got.iter().zip(&expected).zip(&abs).enumerate() {
        // f32 accumulation over k terms: within a few ulps of Σ|a·b| per term
        let bound = 1e-6 * s * (1.0 + (abs.len() as f64).log2()) + 1e-30;
        assert!((*g as f64 - e).abs() <= bound, "{what}[{j}]: {g} vs {e}");
    }
}

/// The packed kernels this CPU runs.
fn kernels() -> Vec<Kernel> {
    let mut kernels = Vec::new();
    if hardware_bf16() {
        kernels.push(Kernel::Avx512);
    }
    #[cfg(target_arch = "x86_64")]
    if amx::available() {
        kernels.push(Kernel::Amx);
    }
    kernels
}

/// `matmul` and every packed kernel against the reference.
fn check_all(a: &FlexTensor, b: &FlexTensor, what: &str) {
    check(matmul(a, b), a, b, what);
    for kernel in kernels() {
        check(
            matmul_packed(a, b, kernel, Finish::NONE),
            a,
            b,
            &format!("{what} ({kernel:?})"),
        );
    }
}

#[test]
fn bf16_products_of_every_shape_and_layout_match_the_rounded_reference() {
    // edges of the 6 × 64 tile, odd k, several k-blocks (k > 512) and column blocks (n > 1024)
    for &(m, k, n) in &[
        (1, 1, 1),
        (5, 7, 3),
        (6, 64, 64),
        (7, 65, 65),
        (13, 513, 100),
        (3, 40, 1100),
        (100, 1030, 70),
        // AMX: whole 32 × 32 blocks and 16-pair tiles, and one past each; two of its k-blocks
        (64, 1024, 128),
        (33, 97, 33),
        (40, 2100, 40),
    ] {
        for (da, db) in [
            (DType::BF16, DType::F32),
            (DType::F32, DType::BF16),
            (DType::BF16, DType::BF16),
        ] {
            let (a, b) = (tensor(&[m, k], 1, da), tensor(&[k, n], 2, db));
            check_all(&a, &b, &format!("{m}×{k}·{k}×{n} {da:?}·{db:?}"));
        }
    }
    // transposed operands and a batch of strided heads
    let at = Flex::float_transpose(tensor(&[9, 11], 3, DType::BF16));
    let b = tensor(&[9, 70], 4, DType::F32);
    check_all(&at, &b, "transposed a");
    // transposed A over whole 16 × 16 transposes and their edges (AMX packs A's rows)
    let at = Flex::float_transpose(tensor(&[70, 45], 15, DType::F32));
    let b = tensor(&[70, 40], 16, DType::BF16);
    check_all(&at, &b, "transposed a, 45 rows");
    // B transposed: whole 16 × 16 blocks, a partial one and a partial panel
    let a = tensor(&[13, 100], 11, DType::BF16);
    let bt = Flex::float_transpose(tensor(&[70, 100], 12, DType::F32));
    check_all(&a, &bt, "transposed b");
    // B transposed with odd k past one 16 × 16 square, bf16 columns, a partial panel
    let a = tensor(&[5, 37], 24, DType::F32);
    let bt = Flex::float_transpose(tensor(&[45, 37], 25, DType::BF16));
    check_all(&a, &bt, "transposed b, odd k");
    // neither dimension contiguous: [m, k, 2] and [k, n, 2] seen as [2, m, k] and [2, k, n]
    let strided =
        |shape: [usize; 3], salt| Flex::float_permute(tensor(&shape, salt, DType::F32), &[2, 0, 1]);
    let (a, b) = (strided([7, 35, 2], 13), strided([35, 66, 2], 14));
    check_all(&a, &b, "strided both");
    let q = Flex::float_swap_dims(tensor(&[2, 5, 3, 8], 5, DType::BF16), 1, 2);
    let kt = Flex::float_transpose(tensor(&[2, 3, 7, 8], 6, DType::BF16));
    check_all(&q, &kt, "batched heads");
}

#[test]
fn finished_products_equal_the_product_finished_after() {
    // one k-block (AMX finishes as it stores: edge blocks, a batch) and two (finished after)
    let bias: Vec<f32> = pattern(70, 21);
    let cases = [
        (
            tensor(&[45, 96], 17, DType::BF16),
            tensor(&[96, 70], 18, DType::F32),
        ),
        (
            tensor(&[3, 33, 40], 19, DType::BF16),
            tensor(&[3, 40, 70], 20, DType::BF16),
        ),
        (
            tensor(&[40, 2100], 22, DType::BF16),
            tensor(&[2100, 70], 23, DType::F32),
        ),
    ];
    for (a, b) in &cases {
        for products in [Products::F32, Products::Bf16] {
            for bias in [None, Some(&bias[..])] {
                for dtype in [DType::F32, DType::BF16] {
                    let fused = products.matmul_into(a, b, bias, dtype);
                    let after = Finish { bias, dtype }.apply(products.matmul(a, b));
                    assert_eq!(fused.dtype(), dtype);
                    assert_eq!(fused.layout().shape(), after.layout().shape());
                    assert_eq!(
                        fused.bytes(),
                        after.bytes(),
                        "{products:?} {:?} bias {} into {dtype:?}",
                        a.layout().shape(),
                        bias.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn large_products_split_over_the_pool_and_agree_with_one_thread() {
    let (a, b) = (
        tensor(&[300, 700], 7, DType::BF16),
        tensor(&[700, 1500], 8, DType::F32),
    );
    for kernel in kernels() {
        let pooled = matmul_packed(&a, &b, kernel, Finish::NONE);
        check(pooled.clone(), &a, &b, &format!("pooled ({kernel:?})"));
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| matmul_packed(&a, &b, kernel, Finish::NONE));
        assert_eq!(
            pooled.as_slice::<f32>().unwrap(),
            single.as_slice::<f32>().unwrap(),
            "{kernel:?}: the thread count changes no sum"
        );
    }
}

#[test]
fn the_fallback_multiplies_the_same_rounded_operands() {
    let (a, b) = (
        tensor(&[13, 70], 9, DType::F32),
        tensor(&[70, 9], 10, DType::F32),
    );
    check(matmul_rounded_f32(&a, &b), &a, &b, "fallback");
    // where this CPU has the instruction, the packed kernel is what `matmul` runs
    for kernel in kernels() {
        check(
            matmul_packed(&a, &b, kernel, Finish::NONE),
            &a,
            &b,
            &format!("{kernel:?}"),
        );
    }
}

#[test]
fn an_empty_inner_dimension_gives_zeros() {
    let (a, b) = (
        tensor(&[3, 0], 0, DType::BF16),
        tensor(&[0, 4], 0, DType::F32),
    );
    assert_eq!(matmul(&a, &b).as_slice::<f32>().unwrap(), &[0.0; 12]);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn whole_rows_round_as_bf16_bits_does() {
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw"))
    {
        return;
    }
    // ties both ways, NaN, infinities, a denormal, -0.0, the largest finite value
    let specials = [
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0e-40,
        -0.0,
        f32::MAX,
        -2.5,
    ];
    let row: Vec<f32> = (0..32)
        .map(|j| specials.get(j).copied().unwrap_or(j as f32 / 3.0))
        .collect();
    let bias = [-0.0f32; 32];
    let mut out = [0u16; 32];
    // SAFETY: the CPU has AVX512-F and -BW (checked above); 32 values each.
    unsafe { super::finish::whole_row::bf16(&row, &bias, out.as_mut_ptr()) };
    let expected: Vec<u16> = row.iter().map(|&x| bf16_bits(x)).collect();
    assert_eq!(out.to_vec(), expected);
}
