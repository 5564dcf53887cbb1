//! Named models. Each preset is the Hugging Face `config.json` of that model (the fields memfit
//! reads, values copied from the model's config on the Hub), so a preset and its config file give
//! the same [`Arch`], and the trainer can build a model from [`preset_config_json`].

use super::{Arch, ArchError, config};
use serde_json::{Value, json};

/// Every preset name, in the order `--help` and errors list them.
pub const PRESET_NAMES: &[&str] = &[
    "t5-small",
    "t5-base",
    "t5-large",
    "t5-3b",
    "chatlm-mini",
    "bert-base-uncased",
    "bert-base-chinese",
    "bert-large-uncased",
    "roberta-large",
    "gpt2",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "llama-2-7b",
];

fn t5(d_model: u64, d_ff: u64, d_kv: u64, heads: u64, layers: u64, vocab: u64) -> Value {
    json!({
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": d_model, "d_ff": d_ff, "d_kv": d_kv, "num_heads": heads,
        "num_layers": layers, "num_decoder_layers": layers,
        "vocab_size": vocab, "feed_forward_proj": "relu", "dropout_rate": 0.1,
        "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6, "tie_word_embeddings": true, "is_encoder_decoder": true,
        "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
        "initializer_factor": 1.0
    })
}

fn bert(hidden: u64, heads: u64, layers: u64, ffn: u64, vocab: u64) -> Value {
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 512,
        "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-12, "pad_token_id": 0
    })
}

fn qwen2(hidden: u64, ffn: u64, heads: u64, kv: u64, layers: u64) -> Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden, "intermediate_size": ffn, "num_attention_heads": heads,
        "num_key_value_heads": kv, "num_hidden_layers": layers, "vocab_size": 151936,
        "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": true, "attention_dropout": 0.0
    })
}

/// The Hugging Face config.json of a preset, or `None` for an unknown name.
pub fn preset_config_json(name: &str) -> Option<Value> {
    let v = match name {
        "t5-small" => t5(512, 2048, 64, 8, 6, 32128),
        "t5-base" => t5(768, 3072, 64, 12, 12, 32128),
        "t5-large" => t5(1024, 4096, 64, 16, 24, 32128),
        "t5-3b" => t5(1024, 16384, 128, 32, 24, 32128),
        // The ChatLM-mini-Chinese model: T5 768/3072/12 heads × 64/10+10 layers, ReLU FFN, tied
        // embeddings, its own 29,298-token tokenizer.
        "chatlm-mini" => {
            let mut v = t5(768, 3072, 64, 12, 10, 29298);
            v["_name_or_path"] = json!("chatlm-mini");
            v
        }
        "bert-base-uncased" => bert(768, 12, 12, 3072, 30522),
        "bert-base-chinese" => bert(768, 12, 12, 3072, 21128),
        "bert-large-uncased" => bert(1024, 16, 24, 4096, 30522),
        "roberta-large" => json!({
            "architectures": ["RobertaModel"],
            "model_type": "roberta",
            "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
            "intermediate_size": 4096, "vocab_size": 50265, "max_position_embeddings": 514,
            "type_vocab_size": 1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-5, "pad_token_id": 1
        }),
        "gpt2" => json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "n_inner": null,
            "vocab_size": 50257, "activation_function": "gelu_new", "resid_pdrop": 0.1,
            "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5
        }),
        "qwen2.5-0.5b" => qwen2(896, 4864, 14, 2, 24),
        "qwen2.5-1.5b" => qwen2(1536, 8960, 12, 2, 28),
        "llama-2-7b" => json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
            "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false
        }),
        _ => return None,
    };
    Some(v)
}

/// A preset as an [`Arch`].
pub fn preset(name: &str) -> Result<Arch, ArchError> {
    let value = preset_config_json(name).ok_or_else(|| ArchError::UnknownPreset {
        name: name.to_string(),
        presets: PRESET_NAMES.join(", "),
    })?;
    config::from_value(&format!("preset {name}"), &value, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published parameter counts (model cards / `sum(p.numel())` in transformers).
    #[test]
    fn presets_have_their_published_parameter_counts() {
        let published = [
            ("t5-small", 60_506_624u64),
            ("t5-base", 222_903_552),
            ("t5-large", 737_668_096),
            ("t5-3b", 2_851_598_336),
            ("chatlm-mini", 187_692_288),
            ("bert-base-uncased", 109_482_240),
            ("bert-base-chinese", 102_267_648),
            ("bert-large-uncased", 335_141_888),
            ("roberta-large", 355_359_744),
            ("gpt2", 124_439_808),
            ("qwen2.5-0.5b", 494_032_768),
            ("qwen2.5-1.5b", 1_543_714_304),
            ("llama-2-7b", 6_738_415_616),
        ];
        assert_eq!(published.len(), PRESET_NAMES.len());
        for (name, count) in published {
            let arch = preset(name).unwrap();
            assert_eq!(arch.params_total(), count, "{name}");
        }
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let err = preset("t5-tiny").unwrap_err().to_string();
        assert!(
            err.contains("t5-tiny") && err.contains("chatlm-mini"),
            "{err}"
        );
    }
}
