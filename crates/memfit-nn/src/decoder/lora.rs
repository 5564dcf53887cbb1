//! Which projections of the decoder carry a LoRA adapter, and the adapters' parameters: A and B of
//! each targeted projection of each layer, named as PEFT names them
//! (`model.layers.0.self_attn.q_proj.lora_A.weight` under PEFT's `base_model.model.` prefix).

use crate::ModelError;
use crate::decoder::config::DecoderConfig;
use crate::decoder::layout::{Group, ParamSpec, Proj};
use crate::layers::lora::{self, LoraSettings};
use crate::layers::params;

/// The names `--lora-targets` accepts.
pub const TARGET_NAMES: &str = "q, k, v, o, gate, up, down (or PEFT's q_proj, k_proj, …), \
                                qkv, mlp, all-linear";

/// The projections named in `names` (memfit estimate's short names, PEFT's module names, the
/// groups `qkv` / `mlp` / `all-linear`), sorted and without repeats; a name that matches no module
/// of the decoder is an error naming it.
pub fn parse_targets(names: &[String]) -> Result<Vec<Proj>, ModelError> {
    let mut targets = Vec::new();
    for raw in names {
        let name = raw.trim();
        let found: &[Proj] = match name {
            "qkv" => &[Proj::Q, Proj::K, Proj::V],
            "mlp" => &[Proj::Gate, Proj::Up, Proj::Down],
            "all-linear" => &Proj::ALL,
            _ => match Proj::ALL
                .iter()
                .find(|p| p.module() == name || p.module().strip_suffix("_proj") == Some(name))
            {
                Some(p) => std::slice::from_ref(p),
                None => {
                    let why = if name == "lm_head" {
                        "an adapter on the LM head is not implemented"
                    } else {
                        "it matches no module of the decoder"
                    };
                    return Err(ModelError::Input(format!(
                        "--lora-targets {name:?}: {why} (targets: {TARGET_NAMES})"
                    )));
                }
            },
        };
        targets.extend_from_slice(found);
    }
    if targets.is_empty() {
        return Err(ModelError::Input(format!(
            "--lora-targets is empty (targets: {TARGET_NAMES})"
        )));
    }
    targets.sort();
    targets.dedup();
    Ok(targets)
}

/// The indices of one adapter's A and B among the LoRA parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraPair {
    pub a: usize,
    pub b: usize,
}

/// Every adapter of a model: A then B of each target of each layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraLayout {
    pub settings: LoraSettings,
    pub targets: Vec<Proj>,
    pub specs: Vec<ParamSpec>,
    /// Per layer, by [`Proj`] order: the adapter of that projection, if targeted.
    pub layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraLayout {
    pub fn new(cfg: &DecoderConfig, settings: LoraSettings, targets: &[Proj]) -> Self {
        let mut specs = Vec::new();
        let mut push =
            |name: String, kind, init| params::push(&mut specs, name, kind, Group::Layers, init);
        let layers = (0..cfg.num_hidden_layers)
            .map(|layer| {
                Proj::ALL.map(|p| {
                    targets.contains(&p).then(|| {
                        let (d_in, d_out) = p.dims(cfg);
                        let (kind_a, kind_b) = settings.kinds(d_in, d_out);
                        let (init_a, init_b) = lora::inits(d_in);
                        let path = p.path(layer);
                        LoraPair {
                            a: push(format!("{path}.lora_A.weight"), kind_a, init_a),
                            b: push(format!("{path}.lora_B.weight"), kind_b, init_b),
                        }
                    })
                })
            })
            .collect();
        Self {
            settings,
            targets: targets.to_vec(),
            specs,
            layers,
        }
    }

    pub fn pair(&self, layer: usize, p: Proj) -> Option<LoraPair> {
        self.layers[layer][p as usize]
    }

    /// Each adapted module's path and its pair, in parameter order.
    pub fn modules(&self) -> impl Iterator<Item = (usize, Proj, LoraPair)> + '_ {
        self.layers.iter().enumerate().flat_map(|(layer, pairs)| {
            Proj::ALL
                .into_iter()
                .filter_map(move |p| pairs[p as usize].map(|pair| (layer, p, pair)))
        })
    }

    pub fn param_count(&self) -> u64 {
        self.specs.iter().map(|s| s.kind.numel() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn short_peft_and_group_names_agree() {
        let short = parse_targets(&names(&["q", "k", "v", "o", "gate", "up", "down"])).unwrap();
        let peft = parse_targets(&names(&[
            "down_proj",
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
        ]))
        .unwrap();
        let groups = parse_targets(&names(&["qkv", "o", "mlp", "q"])).unwrap();
        assert_eq!(short, Proj::ALL);
        assert_eq!(peft, short);
        assert_eq!(groups, short);
        assert_eq!(parse_targets(&names(&["all-linear"])).unwrap(), short);
    }

    #[test]
    fn names_that_match_no_module_are_refused() {
        for bad in ["c_attn", "lm_head", "query"] {
            let e = parse_targets(&names(&["q", bad])).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        assert!(parse_targets(&[]).is_err());
    }

    #[test]
    fn adapters_are_named_and_shaped_as_peft() {
        let cfg = DecoderConfig::from_json(&json!({
            "model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
        }))
        .unwrap();
        let settings = LoraSettings {
            r: 4,
            ..Default::default()
        };
        let layout = LoraLayout::new(&cfg, settings, &[Proj::K, Proj::Down]);
        let got: Vec<(&str, Vec<usize>)> = layout
            .specs
            .iter()
            .take(4)
            .map(|s| (s.name.as_str(), s.kind.hf_shape()))
            .collect();
        assert_eq!(
            got,
            [
                ("model.layers.0.self_attn.k_proj.lora_A.weight", vec![4, 16]),
                ("model.layers.0.self_attn.k_proj.lora_B.weight", vec![8, 4]),
                ("model.layers.0.mlp.down_proj.lora_A.weight", vec![4, 24]),
                ("model.layers.0.mlp.down_proj.lora_B.weight", vec![16, 4]),
            ]
        );
        assert_eq!(layout.specs.len(), 8);
        assert_eq!(layout.modules().count(), 4);
        assert!(layout.pair(1, Proj::Q).is_none());
    }
}
