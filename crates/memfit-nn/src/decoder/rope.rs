//! Rotary position embeddings as transformers computes them (`modeling_rope_utils.py` and
//! `LlamaRotaryEmbedding`): inverse frequencies from `rope_theta` and the `rope_parameters` /
//! legacy `rope_scaling` type (default, linear, dynamic NTK, llama3), cos/sin of position × frequency
//! duplicated over both halves of the head, applied with `rotate_half`.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use serde_json::{Map, Value};

use crate::ModelError;
use crate::decoder::fields::{Fields, bad};
use crate::kernels::hand_written_on;

/// How the inverse frequencies are scaled (`rope_type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    Default,
    /// Frequencies divided by `factor` (position interpolation).
    Linear {
        factor: f64,
    },
    /// NTK-aware: the base grows with the sequence beyond `max_position_embeddings`.
    Dynamic {
        factor: f64,
    },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// A model's RoPE: base, scaling, rotated width and the trained context length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
}

impl Rope {
    /// Reads the RoPE settings of a config: `rope_scaling` (older configs) or `rope_parameters`
    /// (transformers 5; `rope_scaling` wins where both are, as there), with `rope_theta` inside or
    /// beside them (default 10000).
    pub fn from_config(
        raw: &Map<String, Value>,
        head_dim: usize,
        max_position_embeddings: usize,
    ) -> Result<Self, ModelError> {
        let (key, params) = rope_parameters(raw)?;
        let (outer, inner) = (Fields(raw), Fields(&params));
        // Inside the parameters first, beside them second.
        let theta = match inner.opt_f64("rope_theta")? {
            Some(t) => t,
            None => outer.f64_or("rope_theta", 10_000.0)?,
        };
        if theta.is_nan() || theta <= 0.0 {
            return Err(bad("rope_theta", format!("{theta}: must be > 0")));
        }
        let partial = match inner.opt_f64("partial_rotary_factor")? {
            Some(p) => Some(p),
            None => outer.opt_f64("partial_rotary_factor")?,
        };
        if let Some(p) = partial.filter(|p| *p != 1.0) {
            return Err(bad(
                "partial_rotary_factor",
                format!("{p}: only RoPE over the whole head (1.0) is implemented"),
            ));
        }
        let original_max = match inner.opt_usize("original_max_position_embeddings")? {
            Some(n) => n,
            None => outer.usize_or("original_max_position_embeddings", max_position_embeddings)?,
        };
        Ok(Self {
            theta,
            scaling: scaling(key, &inner, original_max)?,
            head_dim,
            max_position_embeddings,
        })
    }

    /// The `head_dim / 2` inverse frequencies for a forward pass whose largest position is
    /// `seq_len − 1` (only dynamic scaling depends on it).
    pub fn inv_freq(&self, seq_len: usize) -> Vec<f32> {
        let dim = self.head_dim;
        let base_freqs = |base: f64| -> Vec<f32> {
            // As torch: the exponent 2i/dim in f32, the power and its inverse rounded to f32.
            (0..dim / 2)
                .map(|i| {
                    let exponent = (2 * i) as f32 / dim as f32;
                    (1.0 / base.powf(exponent as f64)) as f32
                })
                .collect()
        };
        match self.scaling {
            RopeScaling::Default => base_freqs(self.theta),
            RopeScaling::Linear { factor } => base_freqs(self.theta)
                .into_iter()
                .map(|f| (f as f64 / factor) as f32)
                .collect(),
            RopeScaling::Dynamic { factor } => {
                let max = self.max_position_embeddings as f64;
                let len = (seq_len as f64).max(max);
                let d = dim as f64;
                let base = self.theta * ((factor * len / max) - (factor - 1.0)).powf(d / (d - 2.0));
                base_freqs(base)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_len = original_max_position_embeddings as f64;
                let low_wavelen = old_len / low_freq_factor;
                let high_wavelen = old_len / high_freq_factor;
                base_freqs(self.theta)
                    .into_iter()
                    .map(|f| {
                        let f = f as f64;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let scaled = if wavelen > low_wavelen { f / factor } else { f };
                        let medium = (high_wavelen..=low_wavelen).contains(&wavelen);
                        if medium {
                            let smooth = (old_len / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                        } else {
                            scaled as f32
                        }
                    })
                    .collect()
            }
        }
    }

    /// cos and sin `[positions.len(), head_dim]` (row-major f32) of each position: the angles
    /// `position × inv_freq` (an f32 product, as torch), repeated over both halves of the head.
    pub fn angles(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let seq_len = positions.iter().max().map_or(0, |p| p + 1);
        let inv = self.inv_freq(seq_len);
        let dim = self.head_dim;
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions.len() * dim),
            Vec::with_capacity(positions.len() * dim),
        );
        for &p in positions {
            for _half in 0..2 {
                for &f in &inv {
                    let angle = (p as f32 * f) as f64;
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
        }
        (cos, sin)
    }

    /// cos and sin tables `[b, 1, t, head_dim]` in `dtype` for `positions` `[b · t]`: built on the
    /// host where the hand-written CPU ops run (no upload there), else on the device from the
    /// positions and the inverse frequencies, `head_dim` times fewer values uploaded.
    pub fn tables(
        &self,
        positions: &[usize],
        batch: usize,
        device: &Device,
        dtype: DType,
    ) -> RopeTables {
        let t = positions.len() / batch.max(1);
        let shape = [batch, 1, t, self.head_dim];
        if !hand_written_on(device) {
            return self.tables_on_device(positions, shape, device, dtype);
        }
        let (cos, sin) = self.angles(positions);
        let tensor = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, shape), (device, dtype));
        RopeTables {
            cos: tensor(cos),
            sin: tensor(sin),
        }
    }

    /// [`Rope::angles`] computed on `device`: the same f32 products `position × inv_freq` (a
    /// position is exact in f32 below 2^24), their cos and sin in f32 (within an ulp of the host's
    /// f64 ones rounded).
    fn tables_on_device(
        &self,
        positions: &[usize],
        shape: [usize; 4],
        device: &Device,
        dtype: DType,
    ) -> RopeTables {
        let seq_len = positions.iter().max().map_or(0, |p| p + 1);
        let inv = self.inv_freq(seq_len);
        let (n, half) = (positions.len(), inv.len());
        let at: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let at = Tensor::<2>::from_data(TensorData::new(at, [n, 1]), (device, DType::F32));
        let inv = Tensor::<2>::from_data(TensorData::new(inv, [1, half]), (device, DType::F32));
        let angles = at.mul(inv);
        let angles = Tensor::cat(vec![angles.clone(), angles], 1);
        let table = |t: Tensor<2>| t.reshape(shape).cast(dtype);
        RopeTables {
            cos: table(angles.clone().cos()),
            sin: table(angles.sin()),
        }
    }
}

/// The RoPE parameters object and the key it was found under (an empty one when neither is).
fn rope_parameters(
    raw: &Map<String, Value>,
) -> Result<(&'static str, Map<String, Value>), ModelError> {
    let found = ["rope_scaling", "rope_parameters"]
        .into_iter()
        .find_map(|k| raw.get(k).filter(|v| !v.is_null()).map(|v| (k, v)));
    let Some((key, value)) = found else {
        return Ok(("rope_parameters", Map::new()));
    };
    let params = value
        .as_object()
        .ok_or_else(|| bad(key, format!("{value} is not an object")))?;
    if let Some((layer_type, _)) = params.iter().find(|(_, v)| v.is_object()) {
        return Err(bad(
            key,
            format!("per-layer-type RoPE ({layer_type:?}) is not implemented"),
        ));
    }
    Ok((key, params.clone()))
}

/// The scaling `params` (found under `key`) describe by their `rope_type` (legacy: `type`).
fn scaling(key: &str, params: &Fields, original_max: usize) -> Result<RopeScaling, ModelError> {
    let rope_type = match params.str_or("rope_type", "")? {
        "" => params.str_or("type", "default")?,
        t => t,
    };
    let required = |name: &str| {
        params.opt_f64(name)?.ok_or_else(|| {
            bad(
                &format!("{key}.{name}"),
                format!("missing for rope_type {rope_type:?}"),
            )
        })
    };
    Ok(match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: required("factor")?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: required("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: required("factor")?,
            low_freq_factor: required("low_freq_factor")?,
            high_freq_factor: required("high_freq_factor")?,
            original_max_position_embeddings: original_max,
        },
        other => {
            return Err(bad(
                &format!("{key}.rope_type"),
                format!("{other:?} is not implemented (default, linear, dynamic, llama3)"),
            ));
        }
    })
}

/// cos and sin of each row's positions, `[b, 1, t, head_dim]`: computed once per forward pass and
/// shared by every layer.
#[derive(Clone)]
pub struct RopeTables {
    pub cos: Tensor<4>,
    pub sin: Tensor<4>,
}

impl RopeTables {
    /// `x · cos + rotate_half(x) · sin` for `x` `[b, heads, t, head_dim]`, where rotate_half swaps
    /// the halves of the head and negates the new first half (transformers' convention, not the
    /// interleaved pairs of the original paper).
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [_, _, _, d] = x.dims();
        let half = d / 2;
        let first = x.clone().narrow(3, 0, half);
        let second = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rope(v: Value) -> Result<Rope, ModelError> {
        Rope::from_config(v.as_object().unwrap(), 8, 64)
    }

    #[test]
    fn legacy_and_v5_fields_agree() {
        let old =
            rope(json!({"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}}))
                .unwrap();
        let new = rope(
            json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
        )
        .unwrap();
        assert_eq!(old, new);
        assert_eq!(rope(json!({})).unwrap().theta, 10_000.0);
    }

    #[test]
    fn frequencies_follow_each_type() {
        let default = rope(json!({"rope_theta": 100.0})).unwrap().inv_freq(10);
        // 1 / 100^(2i/8): 1, 100^-0.25, 100^-0.5, 100^-0.75
        for (i, f) in default.iter().enumerate() {
            assert!(
                (*f as f64 - 100f64.powf(-(i as f64) / 4.0)).abs() < 1e-7,
                "{i}: {f}"
            );
        }
        let linear =
            rope(json!({"rope_theta": 100.0, "rope_scaling": {"type": "linear", "factor": 4.0}}))
                .unwrap()
                .inv_freq(10);
        assert!((linear[1] * 4.0 - default[1]).abs() < 1e-7);
        // Dynamic: unchanged within max_position_embeddings, a larger base beyond.
        let dynamic =
            rope(json!({"rope_theta": 100.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}}))
                .unwrap();
        assert_eq!(dynamic.inv_freq(64), default);
        let long = dynamic.inv_freq(128);
        let base = 100.0 * (2.0f64 * 128.0 / 64.0 - 1.0).powf(8.0 / 6.0);
        assert!((long[1] as f64 - base.powf(-0.25)).abs() < 1e-7);
        // llama3 with old context 16: wavelengths 2π·100^(i/4) = 6.3, 19.9, 62.8, 198.7 against
        // high 16/4 = 4 and low 16/1 = 16: the first is medium, the others long (divided by 8).
        let llama3 = rope(json!({"rope_theta": 100.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}))
        .unwrap()
        .inv_freq(10);
        let smooth = (16.0 / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
        let want0 = (1.0 - smooth) / 8.0 + smooth;
        assert!((llama3[0] as f64 - want0).abs() < 1e-6, "{}", llama3[0]);
        for i in 1..4 {
            assert!((llama3[i] * 8.0 - default[i]).abs() < 1e-6, "{i}");
        }
    }

    #[test]
    fn unknown_types_and_partial_rotation_are_named() {
        for (v, field) in [
            (
                json!({"rope_scaling": {"type": "yarn", "factor": 2.0}}),
                "rope_scaling.rope_type",
            ),
            (
                json!({"rope_parameters": {"rope_type": "longrope"}}),
                "rope_parameters.rope_type",
            ),
            (
                json!({"rope_scaling": {"type": "linear"}}),
                "rope_scaling.factor",
            ),
            (
                json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
                "low_freq_factor",
            ),
            (
                json!({"partial_rotary_factor": 0.5}),
                "partial_rotary_factor",
            ),
            (
                json!({"rope_parameters": {"full_attention": {"rope_type": "default"}}}),
                "per-layer",
            ),
        ] {
            let e = rope(v.clone()).unwrap_err().to_string();
            assert!(e.contains(field), "{v}: {e}");
        }
    }

    /// The GPU's code path (here ndarray) makes the tables on the device: the host's to an ulp, for
    /// left-padded rows and positions up to 32k, with llama3 scaling.
    #[test]
    fn device_tables_are_the_hosts() {
        let r = rope(
            json!({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}}),
        )
        .unwrap();
        let positions: Vec<usize> = [vec![1, 1, 0, 1, 2], vec![0, 1, 4095, 16383, 32767]].concat();
        #[allow(deprecated)]
        let ndarray = Device::ndarray();
        assert!(!hand_written_on(&ndarray));
        let device = r.tables(&positions, 2, &ndarray, DType::F32);
        let (cos, sin) = r.angles(&positions);
        let read = |t: Tensor<4>| -> Vec<f32> { t.into_data().try_to_vec().unwrap() };
        assert_eq!(device.cos.dims(), [2, 1, 5, 8]);
        for (got, want) in [(read(device.cos), cos), (read(device.sin), sin)] {
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst <= 2.0 * f32::EPSILON, "worst {worst}");
        }
    }

    #[test]
    fn rotation_turns_each_half_pair() {
        let r = rope(json!({"rope_theta": 100.0})).unwrap();
        let tables = r.tables(&[0, 3], 1, &Device::flex(), DType::F32);
        let x: Vec<f32> = (0..16).map(|i| i as f32 - 4.0).collect();
        let xt = Tensor::<4>::from_data(TensorData::new(x.clone(), [1, 1, 2, 8]), &Device::flex());
        let y: Vec<f32> = tables.apply(xt).into_data().try_to_vec().unwrap();
        // Position 0 is the identity; at position 3 pair (j, j+4) turns by 3·inv_freq[j].
        assert_eq!(&y[..8], &x[..8]);
        let inv = r.inv_freq(4);
        for j in 0..4 {
            let (a, b) = (x[8 + j], x[12 + j]);
            let (c, s) = ((3.0 * inv[j]).cos(), (3.0 * inv[j]).sin());
            assert!((y[8 + j] - (a * c - b * s)).abs() < 1e-5);
            assert!((y[12 + j] - (b * c + a * s)).abs() < 1e-5);
        }
    }
}
