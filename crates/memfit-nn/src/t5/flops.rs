//! Model FLOPs of a T5 training step, counted from the shapes the engine multiplies, for MFU
//! (model FLOPs utilisation: useful FLOPs ÷ peak, PaLM's definition — recomputation from gradient
//! checkpointing is not useful work and is not counted).
//!
//! A matmul of `[m, k] × [k, n]` is `2·m·k·n` FLOPs. Backward costs twice the forward (input and
//! weight gradients) where gradients flow; a frozen encoder under a frozen embedding gets no backward.
//! Element-wise work (norms, softmax, dropout, the loss) is left out, as is customary.

use crate::t5::T5Config;

/// Forward matmul FLOPs of one row: (encoder, decoder incl. LM head).
fn forward_per_row(cfg: &T5Config, src: usize, tgt: usize) -> (f64, f64) {
    let (d, inner, ff) = (
        cfg.d_model as f64,
        (cfg.num_heads * cfg.d_kv) as f64,
        cfg.d_ff as f64,
    );
    let (s, t) = (src as f64, tgt as f64);
    let ffn_in = if cfg.feed_forward.gated { 2.0 } else { 1.0 };
    let ffn = ffn_in * d * ff + ff * d;
    // Encoder layer, per source token: q, k, v, o projections, scores QKᵀ and PV over s keys, FFN.
    let enc_layer = s * (4.0 * d * inner + 2.0 * s * inner + ffn);
    // Decoder layer, per target token: self-attention as above over t keys (the engine computes the
    // full masked square), cross-attention q and o (its k and v project the s encoder outputs), FFN.
    let dec_layer = t * (4.0 * d * inner + 2.0 * t * inner)
        + t * (2.0 * d * inner + 2.0 * s * inner)
        + s * 2.0 * d * inner
        + t * ffn;
    let head = t * d * cfg.vocab_size as f64;
    (
        2.0 * cfg.num_layers as f64 * enc_layer,
        2.0 * (cfg.num_decoder_layers as f64 * dec_layer + head),
    )
}

/// Model FLOPs of forward + backward over `rows` rows of `src` source and `tgt` target tokens;
/// `encoder_backward`: whether gradients flow through the encoder (false when the embedding and the
/// encoder are both frozen, the seed's SFT mode).
pub fn t5_training_flops(
    cfg: &T5Config,
    rows: usize,
    src: usize,
    tgt: usize,
    encoder_backward: bool,
) -> f64 {
    let (enc, dec) = forward_per_row(cfg, src, tgt);
    let enc_factor = if encoder_backward { 3.0 } else { 1.0 };
    rows as f64 * (enc_factor * enc + 3.0 * dec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn large_models_approach_six_n_per_token() {
        // Kaplan et al.'s C ≈ 6·N·tokens holds when the weights dominate the attention scores:
        // short sequences, and N counting each stack's matrices for the tokens that pass them.
        let cfg = T5Config::from_json(&json!({
            "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
            "num_decoder_layers": 6, "num_heads": 8
        }))
        .unwrap();
        let (s, t) = (8, 8);
        let got = t5_training_flops(&cfg, 1, s, t, true);
        let d = 512.0;
        let enc_params = 6.0 * (4.0 * d * d + 2.0 * d * 2048.0);
        let dec_params = 6.0 * (8.0 * d * d + 2.0 * d * 2048.0) + d * 32128.0;
        let approx = 6.0 * (enc_params * s as f64 + dec_params * t as f64);
        assert!((got / approx - 1.0).abs() < 0.02, "{got} vs {approx}");
        // Freezing the encoder path removes two thirds of the encoder's share.
        let frozen = t5_training_flops(&cfg, 1, s, t, false);
        let enc_share = 6.0 * enc_params * s as f64;
        assert!((got - frozen - enc_share * 2.0 / 3.0).abs() / got < 0.02);
    }
}
