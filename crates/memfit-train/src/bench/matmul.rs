//! `memfit bench matmul`: the matrix products of one training step of a model, each timed alone on
//! the device, so that cubecl's matmul can be held against cuBLAS (`scripts/gpu/matmul_torch.py`
//! times the same list with `torch.matmul`).
//!
//! The list is counted from the architecture as the engine multiplies: a linear layer computes
//! `x · w` with `w` stored `[in, out]`; burn's backward of `a · b` is `g · bᵀ` for `a` and `aᵀ · g`
//! for `b` (a frozen weight gets no `aᵀ · g`). Attention's scores and context are batched products
//! over `batch × heads`. Products of the same shape and layout are one row with their count.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::{DType, Distribution};
use memfit_nn::ModelError;
use memfit_nn::kernels::linear_op::{self, Products};
use memfit_plan::arch::{Arch, Family, Head};
use serde::Serialize;

/// Which pass of the step a product belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    /// The gradient of the left operand (`g · bᵀ`).
    InputGrad,
    /// The gradient of the right operand (`aᵀ · g`).
    WeightGrad,
}

/// One product `[batch ×] [m, k] · [k, n]`, its operands read transposed where `lhs_t` / `rhs_t`
/// (stored `[k, m]` / `[n, k]`), `count` times a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gemm {
    pub what: String,
    pub pass: Pass,
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub lhs_t: bool,
    pub rhs_t: bool,
    pub count: usize,
}

impl Gemm {
    /// Multiply-adds × 2, once.
    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m) as f64 * self.k as f64 * self.n as f64
    }

    /// `NN`, `NT`, `TN`: how the operands are read (BLAS's naming, row-major).
    pub fn layout(&self) -> &'static str {
        match (self.lhs_t, self.rhs_t) {
            (false, false) => "NN",
            (false, true) => "NT",
            (true, false) => "TN",
            (true, true) => "TT",
        }
    }

    fn key(&self) -> (Pass, usize, usize, usize, usize, bool, bool) {
        let Gemm {
            pass,
            batch,
            m,
            k,
            n,
            lhs_t,
            rhs_t,
            ..
        } = *self;
        (pass, batch, m, k, n, lhs_t, rhs_t)
    }
}

/// What one step trains: every weight, or LoRA adapters of rank `r` on a frozen base (on the
/// projections named in `targets`: q, k, v, o, gate, up, down).
#[derive(Debug, Clone, PartialEq)]
pub enum Trained {
    All,
    Lora { r: usize, targets: Vec<String> },
}

/// The step's shape: rows, source (or text) tokens, target tokens (encoder-decoder).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    pub batch: usize,
    pub seq: usize,
    pub tgt_seq: usize,
}

/// Collects a step's products, merging equal ones.
struct StepProducts {
    trained: Trained,
    list: Vec<Gemm>,
}

impl StepProducts {
    fn push(&mut self, what: &str, pass: Pass, dims: [usize; 4], (lhs_t, rhs_t): (bool, bool)) {
        let [batch, m, k, n] = dims;
        let gemm = Gemm {
            what: what.to_string(),
            pass,
            batch,
            m,
            k,
            n,
            lhs_t,
            rhs_t,
            count: 1,
        };
        match self.list.iter_mut().find(|g| g.key() == gemm.key()) {
            Some(g) => {
                g.count += 1;
                if !g.what.split(", ").any(|w| w == what) {
                    g.what = format!("{}, {what}", g.what);
                }
            }
            None => self.list.push(gemm),
        }
    }

    /// `a · b` (`[batch ×] [m, k] · [k, n]`) forward and backward: `g · bᵀ` where `a` needs a
    /// gradient, `aᵀ · g` where `b` does.
    fn product(
        &mut self,
        what: &str,
        [batch, m, k, n]: [usize; 4],
        grads: (bool, bool),
        t: (bool, bool),
    ) {
        self.push(what, Pass::Forward, [batch, m, k, n], t);
        if grads.0 {
            self.push(what, Pass::InputGrad, [batch, m, n, k], (false, !t.1));
        }
        if grads.1 {
            self.push(what, Pass::WeightGrad, [batch, k, m, n], (!t.0, false));
        }
    }

    /// A linear layer `[rows, d_in] → d_out` named `proj` (a LoRA target name, or "" for one no
    /// adapter can sit on), its input needing a gradient where `input_grad`.
    fn linear(
        &mut self,
        what: &str,
        proj: &str,
        rows: usize,
        (d_in, d_out): (usize, usize),
        input_grad: bool,
    ) {
        let lora = match &self.trained {
            Trained::All => None,
            Trained::Lora { r, targets } => Some((*r, targets.iter().any(|t| t == proj))),
        };
        let weight_trains = lora.is_none();
        self.product(
            what,
            [1, rows, d_in, d_out],
            (input_grad, weight_trains),
            (false, false),
        );
        if let Some((r, true)) = lora {
            // x · A, then (x · A) · B, both adapters trained
            self.product(
                &format!("{what} lora A"),
                [1, rows, d_in, r],
                (input_grad, true),
                (false, false),
            );
            self.product(
                &format!("{what} lora B"),
                [1, rows, r, d_out],
                (true, true),
                (false, false),
            );
        }
    }

    /// Scores `q · kᵀ` and context `p · v` of `heads` heads of width `hd`, `tq` queries over `tk`
    /// keys, for `rows` rows.
    fn attention(
        &mut self,
        what: &str,
        rows: usize,
        heads: usize,
        hd: usize,
        (tq, tk): (usize, usize),
    ) {
        let b = rows * heads;
        self.product(
            &format!("{what} scores"),
            [b, tq, hd, tk],
            (true, true),
            (false, true),
        );
        self.product(
            &format!("{what} context"),
            [b, tq, tk, hd],
            (true, true),
            (false, false),
        );
    }
}

/// The products of one training step of `arch` at `shape` (T5, BERT and llama-style decoders:
/// the families memfit trains).
pub fn training_gemms(
    arch: &Arch,
    shape: StepShape,
    trained: &Trained,
) -> Result<Vec<Gemm>, String> {
    let to = |v: u64| v as usize;
    let (d, heads, kv, hd, ff) = (
        to(arch.hidden),
        to(arch.heads),
        to(arch.kv_heads),
        to(arch.head_dim),
        to(arch.ffn),
    );
    let inner = heads * hd;
    let mut p = StepProducts {
        trained: trained.clone(),
        list: Vec::new(),
    };
    let StepShape {
        batch,
        seq,
        tgt_seq,
    } = shape;
    let (src, tgt) = (batch * seq, batch * tgt_seq);
    let ffn = |p: &mut StepProducts, what: &str, rows: usize| {
        let ins = if arch.gated_ffn {
            ["gate", "up"].as_slice()
        } else {
            ["up"].as_slice()
        };
        for proj in ins {
            p.linear(&format!("{what} {proj}"), proj, rows, (d, ff), true);
        }
        p.linear(&format!("{what} down"), "down", rows, (ff, d), true);
    };
    let projections =
        |p: &mut StepProducts, what: &str, rows: usize, kv_rows: usize, kv_width: usize| {
            p.linear(&format!("{what} q"), "q", rows, (d, inner), true);
            p.linear(&format!("{what} k"), "k", kv_rows, (d, kv_width), true);
            p.linear(&format!("{what} v"), "v", kv_rows, (d, kv_width), true);
            p.linear(&format!("{what} o"), "o", rows, (inner, d), true);
        };
    match arch.family {
        Family::T5 => {
            for _ in 0..arch.encoder_layers {
                projections(&mut p, "encoder", src, src, inner);
                p.attention("encoder", batch, heads, hd, (seq, seq));
                ffn(&mut p, "encoder", src);
            }
            for _ in 0..arch.decoder_layers {
                projections(&mut p, "decoder self", tgt, tgt, inner);
                p.attention("decoder self", batch, heads, hd, (tgt_seq, tgt_seq));
                projections(&mut p, "decoder cross", tgt, src, inner);
                p.attention("decoder cross", batch, heads, hd, (tgt_seq, seq));
                ffn(&mut p, "decoder", tgt);
            }
            p.linear("lm head", "", tgt, (d, to(arch.vocab)), true);
        }
        Family::Bert => {
            for _ in 0..arch.encoder_layers {
                projections(&mut p, "layer", src, src, inner);
                p.attention("layer", batch, heads, hd, (seq, seq));
                ffn(&mut p, "layer", src);
            }
            let labels = match arch.head {
                Head::Classifier { labels } => to(labels),
                _ => 2,
            };
            p.linear("pooler", "", batch, (d, d), true);
            p.linear("classifier", "", batch, (d, labels), true);
        }
        Family::Llama => {
            for _ in 0..arch.decoder_layers {
                projections(&mut p, "layer", src, src, kv * hd);
                p.attention("layer", batch, heads, hd, (seq, seq));
                ffn(&mut p, "layer", src);
            }
            p.linear("lm head", "", src, (d, to(arch.vocab)), true);
        }
        other => {
            return Err(format!(
                "bench matmul: {} is a {other:?} model; memfit trains T5, BERT and llama-style decoders",
                arch.name
            ));
        }
    }
    Ok(p.list)
}

/// One product timed on the device.
#[derive(Debug, Clone, Serialize)]
pub struct GemmTiming {
    #[serde(flatten)]
    pub gemm: Gemm,
    /// Median over the timed runs, one product each, synced after each.
    pub seconds_median: f64,
    pub tflops: f64,
}

/// A `[rows, cols]` operand of `dtype` (`[batch, rows, cols]` where `D` is 3), stored transposed
/// (the last two dimensions swapped, read through a transposed view) where `transposed`.
fn operand<const D: usize>(
    device: &Device,
    dtype: DType,
    dims: [usize; D],
    transposed: bool,
) -> Tensor<D> {
    let mut stored = dims;
    if transposed {
        stored.swap(D - 2, D - 1);
    }
    let t = Tensor::<D>::random(stored, Distribution::Normal(0.0, 1.0), device).cast(dtype);
    if transposed {
        t.swap_dims(D - 2, D - 1)
    } else {
        t
    }
}

/// `warmup` untimed runs of `product` (kernel compiles, autotune), then the median of `iters` timed
/// ones, each waited for.
fn median_seconds<T>(
    device: &Device,
    (warmup, iters): (usize, usize),
    product: impl Fn() -> T,
) -> Result<f64, ModelError> {
    let sync = || {
        device
            .sync()
            .map_err(|e| ModelError::Io(format!("the device failed: {e}")))
    };
    sync()?;
    let mut seconds = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        let out = product();
        sync()?;
        drop(out);
        if i >= warmup {
            seconds.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(super::median(&seconds))
}

/// Times `gemm` on `device` in `dtype`, as the engine runs it: a linear layer's product through
/// `linear_op::product` (memfit's own GEMM on the CPU, burn's matmul on a GPU), a batched one
/// through burn's matmul.
pub fn time_gemm(
    gemm: &Gemm,
    device: &Device,
    dtype: DType,
    runs: (usize, usize),
) -> Result<GemmTiming, ModelError> {
    let Gemm {
        batch,
        m,
        k,
        n,
        lhs_t,
        rhs_t,
        ..
    } = *gemm;
    let median = if batch == 1 {
        let (lhs, rhs) = (
            operand(device, dtype, [m, k], lhs_t),
            operand(device, dtype, [k, n], rhs_t),
        );
        let products = Products::for_activations(dtype);
        median_seconds(device, runs, || {
            linear_op::product(lhs.clone(), rhs.clone(), products)
        })?
    } else {
        let lhs = operand(device, dtype, [batch, m, k], lhs_t);
        let rhs = operand(device, dtype, [batch, k, n], rhs_t);
        median_seconds(device, runs, || lhs.clone().matmul(rhs.clone()))?
    };
    Ok(GemmTiming {
        gemm: gemm.clone(),
        seconds_median: median,
        tflops: if median > 0.0 {
            gemm.flops() / median / 1e12
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(name: &str) -> Arch {
        memfit_plan::arch::preset(name).unwrap()
    }

    fn step_flops(list: &[Gemm]) -> f64 {
        list.iter().map(|g| g.flops() * g.count as f64).sum()
    }

    #[test]
    fn full_training_counts_three_passes_of_every_product() {
        let shape = StepShape {
            batch: 4,
            seq: 32,
            tgt_seq: 16,
        };
        for name in ["t5-small", "bert-base-chinese", "qwen2.5-0.5b"] {
            let list = training_gemms(&arch(name), shape, &Trained::All).unwrap();
            let by = |pass| {
                step_flops(
                    &list
                        .iter()
                        .filter(|g| g.pass == pass)
                        .cloned()
                        .collect::<Vec<_>>(),
                )
            };
            let forward = by(Pass::Forward);
            assert!(forward > 0.0, "{name}");
            // every product's input and weight gradients cost what its forward does
            assert!(
                (by(Pass::InputGrad) / forward - 1.0).abs() < 1e-12,
                "{name}"
            );
            assert!(
                (by(Pass::WeightGrad) / forward - 1.0).abs() < 1e-12,
                "{name}"
            );
            assert!(list.iter().all(|g| g.count > 0 && g.m * g.k * g.n > 0));
        }
    }

    #[test]
    fn t5_forward_matches_the_models_own_flop_count() {
        let config = memfit_plan::arch::preset_config_json("t5-small").unwrap();
        let cfg = memfit_nn::t5::T5Config::from_json(&config).unwrap();
        let (rows, src, tgt) = (4, 32, 16);
        let shape = StepShape {
            batch: rows,
            seq: src,
            tgt_seq: tgt,
        };
        let list = training_gemms(&arch("t5-small"), shape, &Trained::All).unwrap();
        let counted = memfit_nn::t5::flops::t5_training_flops(&cfg, rows, src, tgt, true);
        assert!(
            (step_flops(&list) / counted - 1.0).abs() < 1e-9,
            "{} vs {counted}",
            step_flops(&list)
        );
    }

    #[test]
    fn lora_freezes_the_base_and_adds_the_adapters() {
        let shape = StepShape {
            batch: 2,
            seq: 64,
            tgt_seq: 0,
        };
        let qwen = arch("qwen2.5-0.5b");
        let lora = Trained::Lora {
            r: 16,
            targets: vec!["q".into(), "v".into()],
        };
        let list = training_gemms(&qwen, shape, &lora).unwrap();
        let d = qwen.hidden as usize;
        // no base weight gets a gradient: every weight-gradient product has an adapter's rank in it
        let weight_grads: Vec<&Gemm> = list.iter().filter(|g| g.pass == Pass::WeightGrad).collect();
        assert!(
            weight_grads.iter().all(|g| g.what.contains("lora")
                || g.what.contains("scores")
                || g.what.contains("context")),
            "{weight_grads:?}"
        );
        // q's and v's adapters, not k's
        assert!(
            list.iter()
                .any(|g| g.what.contains("layer q lora A") && g.k == d && g.n == 16)
        );
        assert!(list.iter().any(|g| g.what.contains("layer v lora B")));
        assert!(!list.iter().any(|g| g.what.contains("layer k lora")));
        let full = training_gemms(&qwen, shape, &Trained::All).unwrap();
        assert!(step_flops(&list) < step_flops(&full));
    }

    #[test]
    fn layouts_follow_burns_backward() {
        let mut p = StepProducts {
            trained: Trained::All,
            list: Vec::new(),
        };
        p.product("x", [1, 8, 4, 2], (true, true), (false, true));
        let layouts: Vec<(&str, [usize; 3])> = p
            .list
            .iter()
            .map(|g| (g.layout(), [g.m, g.k, g.n]))
            .collect();
        // a · bᵀ forward; g · (bᵀ)ᵀ = g · b plain; aᵀ · g
        assert_eq!(
            layouts,
            [("NT", [8, 4, 2]), ("NN", [8, 2, 4]), ("TN", [4, 8, 2])]
        );
    }

    #[test]
    fn a_product_times_on_the_cpu() {
        let g = Gemm {
            what: "x".into(),
            pass: Pass::Forward,
            batch: 2,
            m: 8,
            k: 16,
            n: 4,
            lhs_t: true,
            rhs_t: false,
            count: 1,
        };
        let t = time_gemm(&g, &Device::flex(), DType::F32, (1, 3)).unwrap();
        assert!(t.seconds_median > 0.0 && t.tflops > 0.0);
    }
}
