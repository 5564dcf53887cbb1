//! Hugging Face `config.json` → [`Arch`]. Field names and defaults follow each model's
//! `configuration_*.py` in transformers (the default used when a key is absent is noted inline).

use super::cfg::{Cfg, activation_of};
use super::params::{self, Dims};
use super::{Activation, Arch, Block, Family, Head};
use serde_json::Value;

/// A config that cannot be read as an architecture. Names the file (or preset) and the field.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArchError {
    #[error("{file}: not valid JSON: {message}")]
    Json { file: String, message: String },
    #[error(
        "{file}: field `model_type` is {model_type:?}, which memfit does not know (supported: {supported})"
    )]
    UnknownModelType {
        file: String,
        model_type: String,
        supported: &'static str,
    },
    #[error(
        "{file}: field `model_type` is {model_type:?}, which memfit does not know (supported: {supported}), \
         and its fields do not describe a decoder it could estimate generically: {missing}"
    )]
    NotADecoder {
        file: String,
        model_type: String,
        supported: &'static str,
        missing: String,
    },
    #[error("{file}: field `{field}` {problem}")]
    Field {
        file: String,
        field: String,
        problem: String,
    },
    #[error("unknown model {name:?}: not a preset ({presets}) and not a config.json path")]
    UnknownPreset { name: String, presets: String },
}

const SUPPORTED: &str = "t5, mt5, bert, roberta, gpt2, llama, mistral, qwen2, qwen3, gemma, gemma2, \
     phi, phi3, stablelm, falcon, bloom, gpt_neox, gptj, opt, starcoder2, mixtral, qwen2_moe, qwen3_moe, \
     qwen, chatglm, baichuan, internlm2; any other decoder as a generic one when its fields say enough";

/// What a model type's reader decides besides the dimensions.
pub(crate) struct Kind {
    pub family: Family,
    pub activation: Activation,
    pub head: Head,
    pub hidden_dropout: f64,
    pub attention_dropout: f64,
}

/// Reads one config. `file` is only used in error messages; `name` becomes [`Arch::name`].
pub fn parse_config(file: &str, text: &str, name: &str) -> Result<Arch, ArchError> {
    // A byte order mark (Windows editors write one) is no part of the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = serde_json::from_str(text).map_err(|e| ArchError::Json {
        file: file.to_string(),
        message: e.to_string(),
    })?;
    from_value(file, &value, name)
}

/// Builds an [`Arch`] from a parsed config.json value.
pub fn from_value(file: &str, v: &Value, name: &str) -> Result<Arch, ArchError> {
    let cfg = Cfg { file, v };
    if !v.is_object() {
        return Err(ArchError::Json {
            file: file.to_string(),
            message: "the top level must be an object".to_string(),
        });
    }
    let model_type = match v.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        Some(x) => return Err(cfg.err("model_type", format!("must be a string, found {x}"))),
        None => return Err(cfg.err("model_type", "is missing")),
    };
    let mut d = Dims::default();
    let (kind, assumption) = match read_model_type(&model_type, &cfg, &mut d) {
        Err(ArchError::UnknownModelType { .. }) => {
            d = Dims::default();
            match super::generic::parse(&cfg, &mut d)? {
                Ok((kind, assumption)) => (kind, Some(assumption)),
                Err(missing) => {
                    return Err(ArchError::NotADecoder {
                        file: file.to_string(),
                        model_type,
                        supported: SUPPORTED,
                        missing,
                    });
                }
            }
        }
        other => (other?, None),
    };
    super::bounds::check_dims(file, &d)?;
    let mut arch = assemble(name, model_type, kind, d);
    super::bounds::check_params(file, &arch.tensors)?;
    arch.assumption = assumption;
    Ok(arch)
}

/// Reads the fields of `model_type` into `d` with that type's reader.
fn read_model_type(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    match model_type {
        "t5" | "mt5" => t5(model_type, cfg, d),
        "bert" | "roberta" => bert(model_type, cfg, d),
        "gpt2" => gpt2(cfg, d),
        "llama" | "mistral" | "qwen2" | "gemma" => llama(model_type, cfg, d),
        "phi" => phi(cfg, d),
        "stablelm" => stablelm(cfg, d),
        "falcon" => falcon(cfg, d),
        "bloom" => bloom(cfg, d),
        "mixtral" | "qwen2_moe" | "qwen3_moe" => super::moe::parse(model_type, cfg, d),
        "gpt_neox" | "gptj" | "opt" | "phi3" | "gemma2" | "qwen3" | "starcoder2" => {
            super::decoders::parse(model_type, cfg, d)
        }
        t if super::remote::MODEL_TYPES.contains(&t) => super::remote::parse(model_type, cfg, d),
        other => Err(ArchError::UnknownModelType {
            file: cfg.file.to_string(),
            model_type: other.to_string(),
            supported: SUPPORTED,
        }),
    }
}

/// The [`Arch`] of a config whose reader filled `d` and decided `kind`.
fn assemble(name: &str, model_type: String, kind: Kind, d: Dims) -> Arch {
    let tensors = params::build(kind.family, &d, kind.head);
    Arch {
        name: name.to_string(),
        model_type,
        family: kind.family,
        hidden: d.hidden,
        embed_dim: d.embed_dim.unwrap_or(d.hidden),
        heads: d.heads,
        kv_heads: d.kv_heads,
        head_dim: d.head_dim,
        ffn: d.ffn,
        gated_ffn: d.gated,
        activation: kind.activation,
        vocab: d.vocab,
        encoder_layers: d.encoder_layers,
        decoder_layers: d.decoder_layers,
        hidden_dropout: kind.hidden_dropout,
        attention_dropout: kind.attention_dropout,
        head: kind.head,
        block: d.block,
        moe: d.moe,
        tensors,
        assumption: None,
    }
}

/// t5 and mt5 (configuration_t5.py, configuration_mt5.py).
fn t5(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    d.hidden = cfg.u64("d_model")?;
    d.head_dim = cfg.u64("d_kv")?;
    d.heads = cfg.u64("num_heads")?;
    d.kv_heads = d.heads;
    d.ffn = cfg.u64("d_ff")?;
    d.vocab = cfg.u64("vocab_size")?;
    d.encoder_layers = cfg.u64("num_layers")?;
    // configuration_t5.py: num_decoder_layers defaults to num_layers
    d.decoder_layers = cfg.u64_or("num_decoder_layers", d.encoder_layers)?;
    d.rel_buckets = cfg.u64_or("relative_attention_num_buckets", 32)?;
    d.block.rms_norm = true; // T5LayerNorm: fp32 variance in Python
    let proj = cfg.str_or("feed_forward_proj", "relu")?;
    let (gated, act) = match proj.strip_prefix("gated-") {
        Some(a) => (true, a),
        None => (false, proj),
    };
    d.gated = gated;
    // T5 v1.1 / mT5 "gated-gelu" means gelu_new (configuration_t5.py rewrites it).
    let activation = match act {
        "relu" => Activation::Relu,
        "gelu" | "gelu_new" => Activation::GeluNew,
        "silu" => Activation::Silu,
        other => {
            return Err(cfg.err(
                "feed_forward_proj",
                format!("{other:?} is not relu, gelu or silu"),
            ));
        }
    };
    // T5Config: tie_word_embeddings default True; MT5Config: False.
    let tied = cfg.bool_or("tie_word_embeddings", model_type == "t5")?;
    let arch_name = cfg.architecture();
    let head = if arch_name == "T5EncoderModel" || arch_name == "MT5EncoderModel" {
        d.decoder_layers = 0;
        Head::None
    } else if tied {
        Head::LmTied
    } else {
        Head::LmUntied { bias: false }
    };
    let hidden_dropout = cfg.f64_or("dropout_rate", 0.1)?;
    Ok(Kind {
        family: Family::T5,
        activation,
        head,
        hidden_dropout,
        attention_dropout: hidden_dropout,
    })
}

/// bert and roberta (configuration_bert.py, configuration_roberta.py).
fn bert(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    let roberta = model_type == "roberta";
    mha_dims(cfg, d)?;
    d.encoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64("intermediate_size")?;
    d.max_positions = cfg.u64_or("max_position_embeddings", if roberta { 514 } else { 512 })?;
    d.type_vocab = cfg.u64_or("type_vocab_size", if roberta { 1 } else { 2 })?;
    let activation = activation_of(cfg, "hidden_act", "gelu")?;
    let hidden_dropout = cfg.f64_or("hidden_dropout_prob", 0.1)?;
    let attention_dropout = cfg.f64_or("attention_probs_dropout_prob", 0.1)?;
    let head = if cfg.architecture().ends_with("ForSequenceClassification") {
        Head::Classifier {
            labels: cfg.labels()?,
        }
    } else {
        // BertModel/RobertaModel (AutoModel); MLM/other heads are not modelled.
        Head::None
    };
    // BertModel has a pooler and BertForSequenceClassification keeps it; RobertaClassificationHead
    // has a dense hidden×hidden+bias of the same size in its place.
    d.pooler = true;
    Ok(Kind {
        family: Family::Bert,
        activation,
        head,
        hidden_dropout,
        attention_dropout,
    })
}

fn gpt2(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    gpt2_dims(cfg, d)?;
    d.max_positions = cfg.u64_or("n_positions", 1024)?;
    d.fused_qkv = true;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (true, true, true, true);
    d.block.norms = 2;
    Ok(Kind {
        family: Family::Gpt2,
        activation: activation_of(cfg, "activation_function", "gelu_new")?,
        hidden_dropout: cfg.f64_or("resid_pdrop", 0.1)?,
        attention_dropout: cfg.f64_or("attn_pdrop", 0.1)?,
        head: lm_head(cfg, true, false)?,
    })
}

/// llama, mistral, qwen2 and gemma: the same block, biases and head differ.
fn llama(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    llama_block(d);
    let gemma = model_type == "gemma";
    if gemma {
        d.head_dim = cfg.u64_or("head_dim", 256)?;
        d.block.rms_weight_fp32 = true;
    }
    // qwen2 always has q/k/v biases; llama has `attention_bias` (default false).
    d.qkv_bias = model_type == "qwen2" || cfg.bool_or("attention_bias", false)?;
    d.o_bias = model_type != "qwen2" && cfg.bool_or("attention_bias", false)?;
    d.mlp_bias = cfg.bool_or("mlp_bias", false)?;
    let default_act = if gemma { "gelu_pytorch_tanh" } else { "silu" };
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_act", default_act)?,
        hidden_dropout: 0.0,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
        head: lm_head(cfg, gemma, false)?,
    })
}

fn phi(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (true, true, true, true);
    // PhiDecoderLayer: one input_layernorm feeding attention and MLP in parallel.
    (d.block.norms, d.block.parallel, d.block.rotary) = (1, true, true);
    Ok(Kind {
        family: Family::Phi,
        activation: activation_of(cfg, "hidden_act", "gelu_new")?,
        hidden_dropout: cfg.f64_or("resid_pdrop", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
        head: lm_head(cfg, false, true)?,
    })
}

fn stablelm(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    d.gated = true;
    d.norm_bias = true;
    d.qkv_bias = cfg.bool_or("use_qkv_bias", false)?;
    if cfg.bool_or("qk_layernorm", false)? {
        // StableLmLayerNormPerHead: one bias-free LayerNorm(head_dim) per q head and per kv head
        d.qk_norm = (d.heads + d.kv_heads) * d.head_dim;
        d.block.qk_norm = true;
    }
    d.block.parallel = cfg.bool_or("use_parallel_residual", false)?;
    d.block.norms = if d.block.parallel { 1 } else { 2 };
    d.block.rotary = true;
    Ok(Kind {
        family: Family::StableLm,
        activation: activation_of(cfg, "hidden_act", "silu")?,
        hidden_dropout: cfg.f64_or("hidden_dropout", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
        head: lm_head(cfg, false, false)?,
    })
}

fn falcon(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    mha_dims(cfg, d)?;
    d.decoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64_or("ffn_hidden_size", 4 * d.hidden)?;
    let new_arch = cfg.bool_or("new_decoder_architecture", false)?;
    // FalconConfig: multi_query default True; new_decoder_architecture uses num_kv_heads.
    d.kv_heads = if new_arch {
        cfg.u64_or("num_kv_heads", d.heads)?
    } else if cfg.bool_or("multi_query", true)? {
        1
    } else {
        d.heads
    };
    d.fused_qkv = true;
    let bias = cfg.bool_or("bias", false)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias) = (bias, bias, bias);
    d.norm_bias = true;
    // FalconDecoderLayer: the new architecture is always parallel (ln_attn + ln_mlp, or one
    // input_layernorm); the old one when `parallel_attn` (default True).
    d.block.parallel = new_arch || cfg.bool_or("parallel_attn", true)?;
    d.block.norms = if new_arch {
        cfg.u64_or("num_ln_in_parallel_attn", 2)?
    } else if d.block.parallel {
        1
    } else {
        2
    };
    d.block.rotary = !cfg.bool_or("alibi", false)?;
    Ok(Kind {
        family: Family::Falcon,
        activation: activation_of(cfg, "activation", "gelu")?,
        hidden_dropout: cfg.f64_or("hidden_dropout", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
        head: lm_head(cfg, true, false)?,
    })
}

fn bloom(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    d.hidden = cfg.u64_any(&["hidden_size", "n_embed"])?;
    d.heads = cfg.u64_any(&["n_head", "num_attention_heads"])?;
    d.kv_heads = d.heads;
    d.head_dim = cfg.divides(d.hidden, d.heads, "n_head")?;
    d.decoder_layers = cfg.u64_any(&["n_layer", "num_hidden_layers"])?;
    d.vocab = cfg.u64("vocab_size")?;
    d.ffn = 4 * d.hidden; // BloomMLP: dense_h_to_4h
    d.fused_qkv = true;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (true, true, true, true);
    d.block.norms = 2;
    Ok(Kind {
        family: Family::Bloom,
        activation: Activation::GeluTanh, // bloom_gelu_forward (tanh approximation)
        hidden_dropout: cfg.f64_or("hidden_dropout", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
        head: lm_head(cfg, true, false)?,
    })
}

/// Hidden size, vocabulary and heads of configs with one key/value head per query head
/// (`hidden_size`, `num_attention_heads` dividing it, `vocab_size`): bert, roberta, falcon, opt.
pub(crate) fn mha_dims(cfg: &Cfg, d: &mut Dims) -> Result<(), ArchError> {
    d.hidden = cfg.u64("hidden_size")?;
    d.heads = cfg.u64("num_attention_heads")?;
    d.kv_heads = d.heads;
    d.head_dim = cfg.divides(d.hidden, d.heads, "num_attention_heads")?;
    d.vocab = cfg.u64("vocab_size")?;
    Ok(())
}

/// The GPT-2 naming (`n_embd`, `n_head`, `n_layer`, `n_inner` default 4·n_embd, each with its
/// `attribute_map` alias): gpt2 and gptj.
pub(crate) fn gpt2_dims(cfg: &Cfg, d: &mut Dims) -> Result<(), ArchError> {
    d.hidden = cfg.u64_any(&["n_embd", "hidden_size"])?;
    d.heads = cfg.u64_any(&["n_head", "num_attention_heads"])?;
    d.kv_heads = d.heads;
    d.head_dim = cfg.divides(d.hidden, d.heads, "n_head")?;
    d.decoder_layers = cfg.u64_any(&["n_layer", "num_hidden_layers"])?;
    d.ffn = cfg.u64_or("n_inner", 4 * d.hidden)?;
    d.vocab = cfg.u64("vocab_size")?;
    Ok(())
}

/// The block of llama-style decoders: gated MLP, two pre-norms (RMS, in Python), rotary.
pub(crate) fn llama_block(d: &mut Dims) {
    d.gated = true;
    d.block = Block {
        norms: 2,
        rms_norm: true,
        rotary: true,
        ..Block::default()
    };
}

/// Shared fields of llama-style configs (llama, mistral, qwen2, qwen3, gemma, gemma2, phi, phi3,
/// stablelm, starcoder2, mixtral, qwen2_moe, qwen3_moe).
pub(crate) fn decoder_dims(cfg: &Cfg, d: &mut Dims) -> Result<(), ArchError> {
    d.hidden = cfg.u64("hidden_size")?;
    d.heads = cfg.u64("num_attention_heads")?;
    d.kv_heads = cfg.u64_or("num_key_value_heads", d.heads)?;
    kv_heads_divide(cfg, d, "num_key_value_heads")?;
    d.head_dim = match cfg.opt_u64("head_dim")? {
        Some(h) => h,
        None => cfg.divides(d.hidden, d.heads, "num_attention_heads")?,
    };
    d.decoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64("intermediate_size")?;
    d.vocab = cfg.u64("vocab_size")?;
    Ok(())
}

/// Grouped attention needs the key/value heads (read from `field`) to divide the query heads.
pub(crate) fn kv_heads_divide(cfg: &Cfg, d: &Dims, field: &str) -> Result<(), ArchError> {
    if d.heads.is_multiple_of(d.kv_heads) {
        return Ok(());
    }
    Err(cfg.err(
        field,
        format!(
            "({}) does not divide num_attention_heads ({})",
            d.kv_heads, d.heads
        ),
    ))
}

pub(crate) fn lm_head(cfg: &Cfg, tied_default: bool, bias: bool) -> Result<Head, ArchError> {
    Ok(if cfg.bool_or("tie_word_embeddings", tied_default)? {
        Head::LmTied
    } else {
        Head::LmUntied { bias }
    })
}
