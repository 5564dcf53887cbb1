//! A decoder's checkpoints: the full model as transformers writes it (`config.json` +
//! `model.safetensors`, what `AutoModelForCausalLM.from_pretrained` loads), a LoRA adapter as PEFT
//! writes it (what `PeftModel.from_pretrained(base, dir)` loads), and the merged model
//! (`W + A·B·scale` in place of each adapted weight) for `memfit export --merge`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use crate::ModelError;
use crate::decoder::lora::{LoraPair, parse_targets};
use crate::decoder::{BasePrecision, DecoderModel, DecoderOptions, Method};
use crate::layers::lora::merge_into;
use crate::layers::params::{self, Kind};
use crate::weights::peft::{self, AdapterConfig, KEY_PREFIX};
use crate::weights::{HfWeights, LoadReport, NamedTensor, save_hf_dir, write_f32};

impl DecoderModel {
    /// The adapter's `adapter_config.json` under LoRA.
    pub fn adapter_config(&self) -> Option<AdapterConfig> {
        let layout = self.lora_layout()?;
        Some(AdapterConfig {
            settings: layout.settings,
            target_modules: layout
                .targets
                .iter()
                .map(|p| p.module().to_string())
                .collect(),
            base_model_name_or_path: self.base_name.clone(),
            task_type: "CAUSAL_LM".into(),
        })
    }

    /// Writes the adapter into `dir` as PEFT does: `adapter_config.json` and
    /// `adapter_model.safetensors` (f32, PEFT's key names and shapes).
    pub fn save_adapter(&self, dir: &Path) -> Result<(), ModelError> {
        let (Some(config), Some(layout)) = (self.adapter_config(), self.lora_layout()) else {
            return Err(ModelError::Input(
                "this model trains every weight (--method full): it has no adapter to save".into(),
            ));
        };
        let mut tensors = params::hf_tensors(&layout.specs, self.trained());
        for t in &mut tensors {
            t.name = format!("{KEY_PREFIX}{}", t.name);
        }
        let metadata = [("format".to_string(), "pt".to_string())].into();
        write_f32(&dir.join(peft::WEIGHTS_FILE), &tensors, Some(metadata))?;
        config.write(dir)
    }

    /// Writes `config.json` and `model.safetensors` into `dir`: the trained weights under full
    /// training, the base with every adapter merged in under LoRA (a bf16 base as its f32 values).
    pub fn save_merged(&self, dir: &Path) -> Result<(), ModelError> {
        let adapted: HashMap<usize, LoraPair> = match self.lora_layout() {
            Some(lora) => lora
                .modules()
                .map(|(layer, p, pair)| (self.layout.layers[layer].proj(p).weight, pair))
                .collect(),
            None => HashMap::new(),
        };
        let scale = self.lora_layout().map_or(0.0, |l| l.settings.scale());
        let mut tensors = Vec::with_capacity(self.layout.specs.len());
        for (i, spec) in self.layout.specs.iter().enumerate() {
            let mut values = self.base_weight(i)?;
            if let Some(pair) = adapted.get(&i) {
                let lora = self.trained();
                let r = self.lora_layout().map_or(0, |l| l.settings.r);
                merge_into(&mut values, &lora[pair.a], &lora[pair.b], r, scale);
            }
            tensors.push(NamedTensor {
                name: spec.name.clone(),
                shape: spec.kind.hf_shape(),
                values: Cow::Owned(values),
                transpose: match spec.kind {
                    Kind::Linear { d_in, d_out } => Some([d_in, d_out]),
                    _ => None,
                },
            });
        }
        save_hf_dir(dir, &self.config.to_json(), &tensors)
    }

    /// Replaces the adapters' weights with those PEFT (or memfit) saved in `dir`. An adapter of
    /// another shape (rank, scale, targets) or of another base (its recorded base, a tensor's shape)
    /// is an error naming what differs, and the model is left as it was.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<(), ModelError> {
        let config = AdapterConfig::from_dir(dir)?;
        let Some(ours) = self.adapter_config() else {
            return Err(ModelError::Input(format!(
                "{}: a LoRA adapter, but this model trains every weight (--method full)",
                dir.display()
            )));
        };
        check_same_adapter(dir, &config, &ours)?;
        let path = peft::weights_path(dir);
        let mut source = HfWeights::open_file(&path)?;
        let layout = self.lora_layout().expect("checked: LoRA");
        let mut weights = Vec::with_capacity(layout.specs.len());
        for spec in &layout.specs {
            let key = format!("{KEY_PREFIX}{}", spec.name);
            let shape = spec.kind.hf_shape();
            let found = source.shape(&key).map(<[usize]>::to_vec);
            match found {
                None => {
                    return Err(ModelError::Format(format!(
                        "{}: tensor {key} is missing",
                        path.display()
                    )));
                }
                Some(s) if s != shape => {
                    return Err(ModelError::Input(format!(
                        "{}: tensor {key} has shape {s:?}, this base needs {shape:?}: the adapter \
                         belongs to another base model",
                        path.display()
                    )));
                }
                Some(_) => weights.push(spec.kind.from_hf(source.take_shaped(&key, &shape)?)),
            }
        }
        if let Some(extra) = source.untaken().first() {
            return Err(ModelError::Input(format!(
                "{}: tensor {extra} adapts no module of this base model",
                path.display()
            )));
        }
        *self.trained_mut() = weights;
        Ok(())
    }

    /// A base model directory with the adapter in `adapter_dir` on it: the adapter's config sets
    /// the LoRA settings and targets.
    pub fn load_with_adapter(
        base_dir: &Path,
        adapter_dir: &Path,
        base_precision: BasePrecision,
    ) -> Result<(Self, LoadReport), ModelError> {
        let config = AdapterConfig::from_dir(adapter_dir)?;
        let options = DecoderOptions {
            method: Method::Lora {
                settings: config.settings,
                targets: parse_targets(&config.target_modules)
                    .map_err(|e| ModelError::Format(format!("{}: {e}", adapter_dir.display())))?,
            },
            ..DecoderOptions::full()
        }
        .with_base_precision(base_precision);
        let (mut model, report) = Self::load(base_dir, &options)?;
        model.load_adapter(adapter_dir)?;
        Ok((model, report))
    }
}

/// The first difference between the adapter in `dir` and this model's, as an error.
fn check_same_adapter(
    dir: &Path,
    theirs: &AdapterConfig,
    ours: &AdapterConfig,
) -> Result<(), ModelError> {
    let differs = |field: &str, a: String, b: String| {
        Err(ModelError::Input(format!(
            "{}: the adapter's {field} is {a}, this run's is {b}",
            dir.join(peft::CONFIG_FILE).display()
        )))
    };
    let (t, o) = (&theirs.settings, &ours.settings);
    if t.r != o.r {
        return differs("r", t.r.to_string(), o.r.to_string());
    }
    if t.scale() != o.scale() {
        let scale = |s: &crate::layers::lora::LoraSettings| {
            format!("alpha {} (rsLoRA {})", s.alpha, s.use_rslora)
        };
        return differs("lora_alpha", scale(t), scale(o));
    }
    let targets = parse_targets(&theirs.target_modules)
        .map_err(|e| ModelError::Format(format!("{}: {e}", dir.display())))?;
    let ours_targets = parse_targets(&ours.target_modules)?;
    if targets != ours_targets {
        return differs(
            "target_modules",
            format!("{:?}", theirs.target_modules),
            format!("{:?}", ours.target_modules),
        );
    }
    match (
        &theirs.base_model_name_or_path,
        &ours.base_model_name_or_path,
    ) {
        (Some(a), Some(b)) if !same_base(a, b) => differs(
            "base_model_name_or_path",
            format!("{a:?}"),
            format!("{b:?}"),
        ),
        _ => Ok(()),
    }
}

/// Whether two base names are the same model: equal, or paths to the same directory.
fn same_base(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (Path::new(a).canonicalize(), Path::new(b).canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
