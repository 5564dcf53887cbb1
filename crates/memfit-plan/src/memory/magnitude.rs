//! The sizes a setup makes the estimate multiply, bounded in `f64` before any `u64` product is
//! taken. Each bound below is at least every product of the terms built from it (their factors
//! are at most 2^8: bytes per element, saved copies), so below [`MAX_ELEMENTS`] no count wraps;
//! past it the setup is refused naming its flags (exit 2), never answered with a wrapped figure.
//! The model's own dimensions are bounded where its config is read (`arch::bounds`).

use super::setup::Setup;
use crate::arch::Arch;

/// 2^56 elements (72 × 10^15): 64 PiB at a byte each, past any machine by far, and × 2^8 still
/// inside a `u64`.
pub const MAX_ELEMENTS: f64 = (1u64 << 56) as f64;

/// `Err` naming the flags whose product passes [`MAX_ELEMENTS`].
pub fn check(arch: &Arch, setup: &Setup) -> Result<(), String> {
    let f = |v: u64| v as f64;
    let seq = f(setup.seq) + f(setup.tgt_seq);
    let tokens = f(setup.batch) * seq;
    let layers = f(arch.layers_total().max(1));
    let experts = arch
        .moe
        .as_ref()
        .map_or(0.0, |m| f(m.top_k) * f(m.expert_ffn));
    let width = [
        f(arch.hidden),
        f(arch.ffn),
        f(arch.heads * arch.head_dim),
        experts,
    ]
    .into_iter()
    .fold(1.0, f64::max);
    let params = f(arch.params_total());
    let shape = || {
        let tgt = if setup.tgt_seq > 0 {
            format!(" (+ --tgt-seq {})", setup.tgt_seq)
        } else {
            String::new()
        };
        format!("--batch {} × --seq {}{tgt}", setup.batch, setup.seq)
    };
    // The flags are named only when a term fails: the search estimates every candidate.
    type Flags<'a> = &'a dyn Fn() -> String;
    let terms: [(f64, &str, Flags); 9] = [
        (tokens * width * layers, "the activations", &shape),
        (
            tokens * seq * f(arch.heads.max(1)) * layers,
            "the attention scores",
            &shape,
        ),
        (tokens * f(arch.vocab.max(1)), "the logits", &shape),
        (
            tokens * f(setup.accum),
            "the tokens of one optimizer step",
            &|| format!("{} × --accum {}", shape(), setup.accum),
        ),
        (
            f(setup.lora_r) * width * layers * 16.0,
            "the LoRA adapters",
            &|| format!("--lora-r {}", setup.lora_r),
        ),
        (
            f(setup.gpus) * f(setup.nodes) * params,
            "the replicas' parameters",
            &|| format!("--gpus {} × --nodes {}", setup.gpus, setup.nodes),
        ),
        (f(setup.dataset_rows) * 64.0, "the dataset's index", &|| {
            format!("--dataset-rows {}", setup.dataset_rows)
        }),
        (
            f(setup.workers) * params,
            "the loader workers' copies",
            &|| format!("--workers {}", setup.workers),
        ),
        (
            f(setup.zero_bucket_size.unwrap_or(0)),
            "the ZeRO buckets",
            &|| "--zero-bucket-size".to_string(),
        ),
    ];
    match terms
        .into_iter()
        .find(|(elements, ..)| *elements > MAX_ELEMENTS)
    {
        None => Ok(()),
        Some((elements, what, flags)) => Err(format!(
            "{}: {what} would be {elements:.3e} elements, past the {MAX_ELEMENTS:.3e} \
             (2^56) memfit estimates",
            flags()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> Arch {
        crate::arch::preset("qwen2.5-0.5b").unwrap()
    }

    #[test]
    fn real_setups_pass_and_absurd_ones_name_their_flags() {
        let arch = qwen();
        let mut s = Setup::new(&arch);
        s.batch = 64;
        s.seq = 131_072;
        check(&arch, &s).unwrap();
        s.seq = u64::MAX;
        let err = check(&arch, &s).unwrap_err();
        assert!(err.contains("--seq 18446744073709551615"), "{err}");
        s.seq = 1_000_000_000;
        let err = check(&arch, &s).unwrap_err();
        assert!(err.contains("attention scores"), "{err}");
        s.seq = 512;
        s.accum = u64::MAX;
        assert!(check(&arch, &s).unwrap_err().contains("--accum"));
        s.accum = 1;
        s.dataset_rows = u64::MAX;
        assert!(check(&arch, &s).unwrap_err().contains("--dataset-rows"));
    }
}
