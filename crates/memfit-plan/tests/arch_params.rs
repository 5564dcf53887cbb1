//! Exact parameter counts: every row of validation/models/param_counts.csv, the chatlm-mini SFT
//! split, and published counts of the other supported families.

use memfit_plan::arch::{self, Group};
use std::path::PathBuf;

fn validation() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../validation"))
}

#[test]
fn every_row_of_param_counts_csv() {
    let dir = validation().join("models");
    let csv = std::fs::read_to_string(dir.join("param_counts.csv")).unwrap();
    let mut rows = 0;
    for line in csv.lines().skip(1) {
        let mut cells = line.splitn(3, ',');
        let file = cells.next().unwrap();
        let expected: u64 = cells.next().unwrap().parse().unwrap();
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let a = arch::parse_config(file, &text, file).unwrap();
        assert_eq!(a.params_total(), expected, "{file}");
        rows += 1;
    }
    // Every model file a validation row may name has its row.
    let configs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(rows, configs);
    assert!(rows >= 22);
}

#[test]
fn chatlm_mini_sft_freezes_embeddings_and_encoder() {
    let a = arch::preset("chatlm-mini").unwrap();
    assert_eq!(a.params_total(), 187_692_288);
    let frozen = a.params_in(Group::Embeddings) + a.params_in(Group::Encoder);
    assert_eq!(a.params_total() - frozen, 94_396_032);
}

fn count(model_type_json: &str) -> u64 {
    arch::parse_config("test.json", model_type_json, "test")
        .unwrap()
        .params_total()
}

/// Published totals of models whose family no preset covers (model cards, `num_parameters()`).
#[test]
fn other_families_match_published_counts() {
    let mistral = r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
        "num_attention_heads":32,"num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":32000,
        "tie_word_embeddings":false}"#;
    assert_eq!(count(mistral), 7_241_732_096);
    let gemma = r#"{"model_type":"gemma","hidden_size":2048,"intermediate_size":16384,
        "num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,"num_hidden_layers":18,
        "vocab_size":256000}"#;
    assert_eq!(count(gemma), 2_506_172_416);
    let phi2 = r#"{"model_type":"phi","hidden_size":2560,"intermediate_size":10240,
        "num_attention_heads":32,"num_hidden_layers":32,"vocab_size":51200}"#;
    assert_eq!(count(phi2), 2_779_683_840);
    let stablelm = r#"{"model_type":"stablelm","hidden_size":2048,"intermediate_size":5632,
        "num_attention_heads":32,"num_key_value_heads":32,"num_hidden_layers":24,
        "vocab_size":100352,"use_qkv_bias":true,"tie_word_embeddings":false}"#;
    assert_eq!(count(stablelm), 1_644_515_328);
    let falcon = r#"{"model_type":"falcon","hidden_size":4544,"num_attention_heads":71,
        "num_hidden_layers":32,"vocab_size":65024,"multi_query":true,"parallel_attn":true,
        "bias":false}"#;
    assert_eq!(count(falcon), 6_921_720_704);
}

/// The remote-code models' published totals, from their own config.json fields:
/// Qwen-7B 7,721,324,544 (GGUF metadata of Qwen-7B-Chat; LLaMA-Factory's `all params` line);
/// ChatGLM3-6B 6,243,584,000 (PEFT's `all params: 6,245,533,696` with LoRA r 8 on
/// query_key_value, minus its 1,949,696 trainable); InternLM2.5-7B 7,737,708,544 and
/// InternLM2-1.8B 1,889,110,016 (safetensors headers).
#[test]
fn remote_code_models_match_published_counts() {
    let qwen = r#"{"model_type":"qwen","hidden_size":4096,"intermediate_size":22016,
        "kv_channels":128,"no_bias":true,"num_attention_heads":32,"num_hidden_layers":32,
        "vocab_size":151936,"tie_word_embeddings":false}"#;
    assert_eq!(count(qwen), 7_721_324_544);
    let chatglm3 = r#"{"model_type":"chatglm","add_bias_linear":false,"add_qkv_bias":true,
        "ffn_hidden_size":13696,"hidden_size":4096,"kv_channels":128,"multi_query_attention":true,
        "multi_query_group_num":2,"num_attention_heads":32,"num_layers":28,
        "padded_vocab_size":65024,"post_layer_norm":true,"rmsnorm":true,"vocab_size":65024,
        "tie_word_embeddings":false}"#;
    assert_eq!(count(chatglm3), 6_243_584_000);
    let internlm2_5_7b = r#"{"model_type":"internlm2","bias":false,"hidden_size":4096,
        "intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,
        "num_hidden_layers":32,"vocab_size":92544,"tie_word_embeddings":false}"#;
    assert_eq!(count(internlm2_5_7b), 7_737_708_544);
    let internlm2_1_8b = r#"{"model_type":"internlm2","bias":false,"hidden_size":2048,
        "intermediate_size":8192,"num_attention_heads":16,"num_key_value_heads":8,
        "num_hidden_layers":24,"vocab_size":92544,"tie_word_embeddings":false}"#;
    assert_eq!(count(internlm2_1_8b), 1_889_110_016);
    // ChatGLM3's LoRA on query_key_value: PEFT's 1,949,696 trainable (r 8, A 4096×8, B 8×4608)
    let a = arch::parse_config("c.json", chatglm3, "chatglm3").unwrap();
    let qkv: Vec<_> = a
        .tensors
        .iter()
        .filter(|t| t.role == arch::Role::Qkv)
        .collect();
    assert_eq!(qkv.len(), 1);
    assert_eq!(8 * (qkv[0].rows + qkv[0].cols) * qkv[0].count, 1_949_696);
}

/// Baichuan's `W_pack` holds q, k and v in one linear: Baichuan2-7B counts what the same
/// dimensions count as a llama (vocabulary 125,696, untied head), 7,505,973,248, whether its
/// config names `max_position_embeddings` (rotary, 7B) or not (ALiBi, 13B).
#[test]
fn baichuan_w_pack_counts_as_q_k_v() {
    let dims = r#""hidden_size":4096,"intermediate_size":11008,"num_attention_heads":32,
        "num_hidden_layers":32,"vocab_size":125696,"tie_word_embeddings":false"#;
    let baichuan = format!(r#"{{"model_type":"baichuan","max_position_embeddings":4096,{dims}}}"#);
    let llama = format!(r#"{{"model_type":"llama",{dims}}}"#);
    assert_eq!(count(&baichuan), count(&llama));
    assert_eq!(count(&baichuan), 7_505_973_248);
    let a = arch::parse_config("b.json", &baichuan, "b").unwrap();
    assert!(a.block.rotary);
    let alibi = format!(r#"{{"model_type":"baichuan",{dims}}}"#);
    let a = arch::parse_config("b.json", &alibi, "b").unwrap();
    assert!(!a.block.rotary);
    assert!(a.tensors.iter().any(|t| t.role == arch::Role::Qkv));
}

/// An unknown decoder whose fields say enough is estimated as a generic llama-style decoder,
/// with the assumption named; one whose fields do not is refused, naming what is missing.
#[test]
fn unknown_decoder_is_generic_with_its_assumption() {
    let fields = r#""hidden_size":4096,"intermediate_size":11008,"num_attention_heads":32,
        "num_hidden_layers":32,"vocab_size":64000"#;
    let yi_like = format!(r#"{{"model_type":"aquila",{fields}}}"#);
    let a = arch::parse_config("a/config.json", &yi_like, "a").unwrap();
    let llama = format!(r#"{{"model_type":"llama",{fields},"tie_word_embeddings":false}}"#);
    assert_eq!(a.params_total(), count(&llama));
    let said = a.assumption.expect("an assumption");
    assert!(said.contains("a/config.json") && said.contains("aquila") && said.contains("generic"));
    assert!(
        arch::parse_config("l.json", &llama, "l")
            .unwrap()
            .assumption
            .is_none()
    );
    let e = arch::parse_config(
        "m/config.json",
        r#"{"model_type":"mamba","hidden_size":768,
        "num_hidden_layers":24,"vocab_size":50280}"#,
        "x",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("m/config.json") && e.contains("mamba") && e.contains("num_attention_heads"),
        "{e}"
    );
}

#[test]
fn errors_name_the_file_and_field() {
    let e = arch::parse_config("m/config.json", r#"{"model_type":"mamba"}"#, "x").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("m/config.json") && msg.contains("model_type") && msg.contains("mamba"));
    let e = arch::parse_config("c.json", r#"{"model_type":"t5","d_model":512}"#, "x").unwrap_err();
    assert!(
        e.to_string().contains("c.json") && e.to_string().contains("d_kv"),
        "{e}"
    );
    let e = arch::parse_config(
        "c.json",
        r#"{"model_type":"bert","hidden_size":"big"}"#,
        "x",
    )
    .unwrap_err();
    assert!(e.to_string().contains("hidden_size"), "{e}");
    let e = arch::parse_config("c.json", "{not json", "x").unwrap_err();
    assert!(e.to_string().contains("c.json"), "{e}");
}

#[test]
fn preset_config_json_round_trips() {
    for name in arch::PRESET_NAMES {
        let v = arch::preset_config_json(name).unwrap();
        let text = serde_json::to_string(&v).unwrap();
        let a = arch::parse_config("x", &text, name).unwrap();
        assert_eq!(a, arch::preset(name).unwrap());
    }
    assert!(arch::preset_config_json("nope").is_none());
}
