//! Emitted configs carry only keys the tools accept, with the types they expect.

use memfit_plan::arch::preset;
use memfit_plan::emit::{self, FsdpVersion, Hyper, Kind};
use memfit_plan::memory::{Precision, Setup, Zero};

fn setup(zero: Zero, gpus: u64, offload: bool) -> (memfit_plan::arch::Arch, Setup) {
    let arch = preset("t5-base").unwrap();
    let mut s = Setup::new(&arch);
    s.batch = 4;
    s.accum = 8;
    s.gpus = gpus;
    s.zero = zero;
    s.precision = Precision::AmpBf16;
    s.offload_optimizer = offload;
    s.offload_params = offload && zero == Zero::Z3;
    s.grad_ckpt = true;
    s.workers = 2;
    (arch, s)
}

/// Top-level keys of DeepSpeed's config (deepspeed/runtime/constants.py) and of its
/// zero_optimization section (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig fields).
const DS_KEYS: &[&str] = &[
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_optimization",
    "bf16",
    "fp16",
    "optimizer",
    "steps_per_print",
    "wall_clock_breakdown",
];
const DS_ZERO_KEYS: &[&str] = &[
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "offload_optimizer",
    "offload_param",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
];

#[test]
fn deepspeed_json() {
    for (zero, gpus, offload) in [
        (Zero::Z2, 4, false),
        (Zero::Z3, 2, true),
        (Zero::Z2, 1, true),
    ] {
        let (arch, s) = setup(zero, gpus, offload);
        let v = emit::deepspeed(&arch, &s, &Hyper::defaults("t5-base", &s));
        for k in v.as_object().unwrap().keys() {
            assert!(DS_KEYS.contains(&k.as_str()), "unknown DeepSpeed key {k}");
        }
        let z = &v["zero_optimization"];
        for k in z.as_object().unwrap().keys() {
            assert!(DS_ZERO_KEYS.contains(&k.as_str()), "unknown zero key {k}");
        }
        assert_eq!(v["train_batch_size"].as_u64(), Some(4 * 8 * gpus));
        assert_eq!(v["train_micro_batch_size_per_gpu"].as_u64(), Some(4));
        assert_eq!(v["gradient_accumulation_steps"].as_u64(), Some(8));
        assert_eq!(z["stage"].as_u64(), Some(zero.stage() as u64));
        assert!(v["bf16"]["enabled"].as_bool().unwrap());
        assert!(!v["fp16"]["enabled"].as_bool().unwrap());
        assert!(z["reduce_bucket_size"].is_u64());
        if offload {
            assert_eq!(z["offload_optimizer"]["device"], "cpu");
            assert!(z["offload_optimizer"]["pin_memory"].is_boolean());
        }
        assert_eq!(
            z.get("offload_param").is_some(),
            offload && zero == Zero::Z3
        );
    }
}

/// A YAML value as PyYAML's SafeLoader (YAML 1.1, what accelerate reads its config with) types it.
#[derive(Debug, Clone, PartialEq)]
enum Yaml {
    Str(String),
    Bool(bool),
    Int(i64),
    Null,
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    /// PyYAML's implicit resolvers (yaml/resolver.py) for a plain scalar: YAML 1.1 booleans
    /// (yes/no/on/off/true/false in three casings), null, decimal integers; anything else a string.
    fn plain(text: &str) -> Yaml {
        const TRUE: &[&str] = &[
            "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
        ];
        const FALSE: &[&str] = &[
            "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
        ];
        if TRUE.contains(&text) {
            Yaml::Bool(true)
        } else if FALSE.contains(&text) {
            Yaml::Bool(false)
        } else if ["", "~", "null", "Null", "NULL"].contains(&text) {
            Yaml::Null
        } else if let Ok(n) = text.parse::<i64>() {
            Yaml::Int(n)
        } else {
            Yaml::Str(text.to_string())
        }
    }

    fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// A mapping being read: its entries so far and the key waiting for its value.
type OpenMap = (Vec<(String, Yaml)>, Option<String>);

/// Builds [`Yaml`] from yaml-rust2's events, which keep each scalar's quoting style.
#[derive(Default)]
struct Loader {
    stack: Vec<OpenMap>,
    root: Option<Yaml>,
}

impl yaml_rust2::parser::MarkedEventReceiver for Loader {
    fn on_event(&mut self, ev: yaml_rust2::Event, _: yaml_rust2::scanner::Marker) {
        use yaml_rust2::Event;
        use yaml_rust2::scanner::TScalarStyle;
        let value = match ev {
            Event::MappingStart(..) => {
                self.stack.push((Vec::new(), None));
                return;
            }
            Event::MappingEnd => Yaml::Map(self.stack.pop().expect("open mapping").0),
            Event::Scalar(text, TScalarStyle::Plain, ..) => Yaml::plain(&text),
            Event::Scalar(text, ..) => Yaml::Str(text),
            Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {
                return;
            }
            other => panic!("unexpected YAML event {other:?}"),
        };
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some((entries, key)) => match key.take() {
                Some(k) => entries.push((k, value)),
                None => match value {
                    Yaml::Str(k) => *key = Some(k),
                    other => panic!("non-string key {other:?}"),
                },
            },
        }
    }
}

fn load_yaml(text: &str) -> Yaml {
    let mut loader = Loader::default();
    yaml_rust2::parser::Parser::new_from_str(text)
        .load(&mut loader, false)
        .expect("valid YAML");
    loader.root.expect("one document")
}

/// accelerate's ClusterConfig / BaseConfig fields (accelerate 1.15,
/// accelerate/commands/config/config_args.py) with the type its dataclass declares.
const ACCELERATE_KEYS: &[(&str, &str)] = &[
    ("compute_environment", "str"),
    ("distributed_type", "str"),
    ("mixed_precision", "str"),
    ("machine_rank", "int"),
    ("main_training_function", "str"),
    ("num_machines", "int"),
    ("num_processes", "int"),
    ("rdzv_backend", "str"),
    ("same_network", "bool"),
    ("use_cpu", "bool"),
    ("deepspeed_config", "map"),
    ("fsdp_config", "map"),
];
/// deepspeed_config keys (accelerate/commands/config/cluster.py).
const ACCELERATE_DS_KEYS: &[(&str, &str)] = &[
    ("deepspeed_config_file", "str"),
    ("zero3_init_flag", "bool"),
];
/// The fsdp_config keys `accelerate config` writes for FSDP version 2 (accelerate 1.15,
/// accelerate/commands/config/cluster.py, read back as FSDP_* variables by utils/launch.py
/// `prepare_multi_gpu_env` into FullyShardedDataParallelPlugin): `fsdp_reshard_after_forward` is a
/// bool; the prefetch, `use_orig_params` and `sync_module_states` keys are version 1's only (the
/// plugin raises on them under version 2).
const ACCELERATE_FSDP2_KEYS: &[(&str, &str)] = &[
    ("fsdp_version", "int"),
    ("fsdp_reshard_after_forward", "bool"),
    ("fsdp_auto_wrap_policy", "str"),
    ("fsdp_offload_params", "bool"),
    ("fsdp_state_dict_type", "str"),
    ("fsdp_cpu_ram_efficient_loading", "bool"),
    ("fsdp_activation_checkpointing", "bool"),
];
/// Version 1: the sharding strategy's name under `fsdp_reshard_after_forward` and under
/// `fsdp_sharding_strategy` (deprecated, but what the plugin reads under `accelerate launch`: the
/// launcher's FSDP_SHARDING_STRATEGY defaults to FULL_SHARD), and the keys version 2 drops.
const ACCELERATE_FSDP1_KEYS: &[(&str, &str)] = &[
    ("fsdp_version", "int"),
    ("fsdp_reshard_after_forward", "str"),
    ("fsdp_sharding_strategy", "str"),
    ("fsdp_backward_prefetch", "str"),
    ("fsdp_forward_prefetch", "bool"),
    ("fsdp_use_orig_params", "bool"),
    ("fsdp_sync_module_states", "bool"),
    ("fsdp_auto_wrap_policy", "str"),
    ("fsdp_offload_params", "bool"),
    ("fsdp_state_dict_type", "str"),
    ("fsdp_cpu_ram_efficient_loading", "bool"),
    ("fsdp_activation_checkpointing", "bool"),
];
/// accelerate/utils/constants.py: the accepted values.
const FSDP_AUTO_WRAP_POLICY: &[&str] = &["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"];
const FSDP_SHARDING_STRATEGY: &[&str] = &[
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
];
const FSDP_BACKWARD_PREFETCH: &[&str] = &["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"];
const FSDP_STATE_DICT_TYPE: &[&str] =
    &["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"];
const FSDP2_STATE_DICT_TYPE: &[&str] = &["SHARDED_STATE_DICT", "FULL_STATE_DICT"];

fn str_in(map: &Yaml, key: &str, allowed: &[&str]) {
    match map.get(key) {
        Some(Yaml::Str(v)) => assert!(
            allowed.contains(&v.as_str()),
            "{key}: {v} not in {allowed:?}"
        ),
        other => panic!("{key}: {other:?}"),
    }
}

/// The defaults with FSDP `version`.
fn with_fsdp(s: &Setup, version: FsdpVersion) -> Hyper {
    Hyper {
        fsdp_version: version,
        ..Hyper::defaults("t", s)
    }
}

#[test]
fn fsdp_yaml_has_each_versions_keys_and_values() {
    for (zero, full) in [(Zero::FsdpFull, true), (Zero::FsdpGradOp, false)] {
        let (_, s) = setup(zero, 3, false);
        let y = load_yaml(&emit::accelerate(&s, &with_fsdp(&s, FsdpVersion::V2)));
        assert_eq!(y.get("distributed_type"), Some(&Yaml::Str("FSDP".into())));
        // FSDP's MixedPrecision policy comes from the top-level key, as HF's bf16 says
        assert_eq!(y.get("mixed_precision"), Some(&Yaml::Str("bf16".into())));
        let f = y.get("fsdp_config").unwrap();
        check_types(f, ACCELERATE_FSDP2_KEYS, "fsdp_config v2");
        assert_eq!(f.get("fsdp_version"), Some(&Yaml::Int(2)));
        assert_eq!(f.get("fsdp_reshard_after_forward"), Some(&Yaml::Bool(full)));
        str_in(f, "fsdp_auto_wrap_policy", FSDP_AUTO_WRAP_POLICY);
        str_in(f, "fsdp_state_dict_type", FSDP2_STATE_DICT_TYPE);

        let y = load_yaml(&emit::accelerate(&s, &with_fsdp(&s, FsdpVersion::V1)));
        let f = y.get("fsdp_config").unwrap();
        check_types(f, ACCELERATE_FSDP1_KEYS, "fsdp_config v1");
        assert_eq!(f.get("fsdp_version"), Some(&Yaml::Int(1)));
        str_in(f, "fsdp_reshard_after_forward", FSDP_SHARDING_STRATEGY);
        let strategy = if full { "FULL_SHARD" } else { "SHARD_GRAD_OP" };
        for key in ["fsdp_reshard_after_forward", "fsdp_sharding_strategy"] {
            assert_eq!(f.get(key), Some(&Yaml::Str(strategy.into())), "{key}");
        }
        str_in(f, "fsdp_backward_prefetch", FSDP_BACKWARD_PREFETCH);
        str_in(f, "fsdp_state_dict_type", FSDP_STATE_DICT_TYPE);
    }
}

#[test]
fn hf_fsdp_arguments_match_the_yaml() {
    let (_, mut s) = setup(Zero::FsdpFull, 3, false);
    s.offload_optimizer = true;
    s.offload_params = true;
    for (version, number) in [(FsdpVersion::V2, 2), (FsdpVersion::V1, 1)] {
        let hyper = Hyper {
            fsdp_version: version,
            ..Hyper::defaults("t5-base", &s)
        };
        let v = emit::hf_training_args(&s, &hyper);
        // `fsdp: true` with the settings in fsdp_config (transformers 5: a strategy string in
        // `fsdp` is deprecated)
        assert_eq!(v["fsdp"], true);
        let c = &v["fsdp_config"];
        assert_eq!(c["cpu_offload"], true);
        assert_eq!(c["version"], number);
        assert_eq!(c["activation_checkpointing"], true);
        assert_eq!(v["gradient_checkpointing"], false);
        assert!(v.get("deepspeed").is_none());
        match version {
            FsdpVersion::V2 => assert_eq!(c["reshard_after_forward"], true),
            FsdpVersion::V1 => assert_eq!(c["reshard_after_forward"], "full_shard"),
        }
        let y = load_yaml(&emit::accelerate(&s, &with_fsdp(&s, version)));
        let f = y.get("fsdp_config").unwrap();
        assert_eq!(f.get("fsdp_offload_params"), Some(&Yaml::Bool(true)));
    }
}

fn check_types(map: &Yaml, known: &[(&str, &str)], what: &str) {
    let Yaml::Map(entries) = map else {
        panic!("{what} is not a mapping: {map:?}")
    };
    for (k, v) in entries {
        let (_, ty) = known
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("unknown {what} key {k}"));
        let ok = matches!(
            (*ty, v),
            ("str", Yaml::Str(_))
                | ("int", Yaml::Int(_))
                | ("bool", Yaml::Bool(_))
                | ("map", Yaml::Map(_))
        );
        assert!(ok, "{what} {k}: {v:?} is not read as {ty}");
    }
}

#[test]
fn accelerate_yaml_reads_as_pyyaml_reads_it() {
    for (zero, gpus, offload) in [
        (Zero::Z0, 1, false),
        (Zero::Z0, 4, false),
        (Zero::Z3, 2, true),
        (Zero::FsdpFull, 2, false),
    ] {
        let (_, s) = setup(zero, gpus, offload);
        let text = emit::accelerate(&s, &with_fsdp(&s, FsdpVersion::V2));
        assert!(text.starts_with("# "), "names its target version: {text}");
        assert!(text.contains("accelerate 1.15"), "{text}");
        let y = load_yaml(&text);
        check_types(&y, ACCELERATE_KEYS, "accelerate");
        if let Some(ds) = y.get("deepspeed_config") {
            check_types(ds, ACCELERATE_DS_KEYS, "deepspeed_config");
        }
        if let Some(fsdp) = y.get("fsdp_config") {
            check_types(fsdp, ACCELERATE_FSDP2_KEYS, "fsdp_config");
            // checkpointing is FSDP's here (transformers refuses it in TrainingArguments too)
            assert_eq!(
                fsdp.get("fsdp_activation_checkpointing"),
                Some(&Yaml::Bool(s.grad_ckpt))
            );
        }
        assert_eq!(y.get("num_processes"), Some(&Yaml::Int(gpus as i64)));
        let expected = match (zero, gpus) {
            (Zero::Z0, 1) => "NO",
            (Zero::Z0, _) => "MULTI_GPU",
            (Zero::FsdpFull, _) => "FSDP",
            _ => "DEEPSPEED",
        };
        assert_eq!(
            y.get("distributed_type"),
            Some(&Yaml::Str(expected.into())),
            "{text}"
        );
        if zero == Zero::Z0 || zero.is_fsdp() {
            assert_eq!(y.get("mixed_precision"), Some(&Yaml::Str("bf16".into())));
        }
    }
    // fp32 is accelerate's string "no", not YAML 1.1's false
    let (_, mut s) = setup(Zero::Z0, 1, false);
    s.precision = Precision::Fp32;
    let y = load_yaml(&emit::accelerate(&s, &with_fsdp(&s, FsdpVersion::V2)));
    assert_eq!(y.get("mixed_precision"), Some(&Yaml::Str("no".into())));
}

#[test]
fn the_yaml_reader_resolves_as_yaml_1_1() {
    // the test's own reader: a plain NO is false, a quoted one the string
    let y = load_yaml("a: NO\nb: 'NO'\nc: 3\nd: x\n");
    assert_eq!(y.get("a"), Some(&Yaml::Bool(false)));
    assert_eq!(y.get("b"), Some(&Yaml::Str("NO".into())));
    assert_eq!(y.get("c"), Some(&Yaml::Int(3)));
    assert_eq!(y.get("d"), Some(&Yaml::Str("x".into())));
}

/// transformers.TrainingArguments fields used, with their types.
const HF_FIELDS: &[(&str, &str)] = &[
    ("output_dir", "str"),
    ("per_device_train_batch_size", "int"),
    ("gradient_accumulation_steps", "int"),
    ("gradient_checkpointing", "bool"),
    ("bf16", "bool"),
    ("fp16", "bool"),
    ("optim", "str"),
    ("learning_rate", "float"),
    ("num_train_epochs", "float"),
    ("max_steps", "int"),
    ("max_grad_norm", "float"),
    ("dataloader_num_workers", "int"),
    ("dataloader_pin_memory", "bool"),
    ("use_cpu", "bool"),
    ("save_strategy", "str"),
    ("logging_steps", "int"),
    ("deepspeed", "str"),
    ("fsdp", "bool"),
    ("fsdp_config", "map"),
];
/// transformers OptimizerNames values.
const HF_OPTIM: &[&str] = &[
    "adamw_torch",
    "adafactor",
    "sgd",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
];

#[test]
fn hf_training_arguments() {
    let (_, s) = setup(Zero::Z2, 2, false);
    let v = emit::hf_training_args(&s, &Hyper::defaults("t5-base", &s));
    for (k, val) in v.as_object().unwrap() {
        let (_, ty) = HF_FIELDS
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("not a TrainingArguments field: {k}"));
        let ok = match *ty {
            "int" => val.is_i64(),
            "float" => val.is_f64(),
            "bool" => val.is_boolean(),
            "map" => val.is_object(),
            _ => val.is_string(),
        };
        assert!(ok, "{k} = {val} is not {ty}");
    }
    assert!(HF_OPTIM.contains(&v["optim"].as_str().unwrap()));
    assert_eq!(v["per_device_train_batch_size"], 4);
    assert_eq!(v["deepspeed"], "deepspeed.json");
    // transformers 5 still takes `gradient_checkpointing` (training_args.py); it has no
    // `activation_checkpointing` field: that is FSDP's key, set in the accelerate YAML
    assert_eq!(v["gradient_checkpointing"], true);
    assert!(v.get("activation_checkpointing").is_none());
    let (_, fsdp) = setup(Zero::FsdpFull, 2, false);
    let v = emit::hf_training_args(&fsdp, &Hyper::defaults("t5-base", &fsdp));
    for k in v.as_object().unwrap().keys() {
        assert!(HF_FIELDS.iter().any(|(n, _)| n == k), "not a field: {k}");
    }
    assert!(v["fsdp_config"].is_object());
    assert_eq!(
        v["gradient_checkpointing"], false,
        "the Trainer refuses it beside FSDP's activation checkpointing"
    );
}

#[test]
fn memfit_train_toml() {
    let (_, s) = setup(Zero::Z0, 1, false);
    let text = emit::memfit_train(&s, &Hyper::defaults("chatlm-mini", &s));
    assert!(text.contains("No training data named"), "{text}");
    let t: toml::Table = toml::from_str(&text).unwrap();
    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
    let mut expected = vec![
        "model",
        "task",
        "batch",
        "accum",
        "seq",
        "tgt_seq",
        "precision",
        "optimizer",
        "grad_ckpt",
        "lr",
        "epochs",
        "max_steps",
    ];
    expected.sort();
    let mut got = keys.clone();
    got.sort();
    assert_eq!(got, expected);
    assert_eq!(t["batch"].as_integer(), Some(4));
    assert_eq!(t["grad_ckpt"].as_bool(), Some(true));
    // memfit train's own spelling: its bf16 is mixed (f32 master weights), as amp-bf16 is
    assert_eq!(t["precision"].as_str(), Some("bf16"));
    assert!(t["lr"].is_float());
    let hyper = Hyper {
        data: Some("/d/train.jsonl".into()),
        tokenizer: Some("/d/tok".into()),
        ..Hyper::defaults("chatlm-mini", &s)
    };
    let text = emit::memfit_train(&s, &hyper);
    assert!(!text.contains("No training data named"), "{text}");
    let t: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(t["data"].as_str(), Some("/d/train.jsonl"));
    assert_eq!(t["tokenizer"].as_str(), Some("/d/tok"));
    assert!(t.get("valid").is_none());
}

/// The accelerate YAML and the TrainingArguments name the DeepSpeed JSON as the caller says (an
/// absolute path where the files are written), quoted for YAML.
#[test]
fn the_deepspeed_file_is_named_as_the_caller_says() {
    let (_, s) = setup(Zero::Z2, 2, false);
    let hyper = Hyper {
        deepspeed_config: Some("/runs/it's here/deepspeed.json".into()),
        ..Hyper::defaults("t5-base", &s)
    };
    let y = load_yaml(&emit::accelerate(&s, &hyper));
    let file = y
        .get("deepspeed_config")
        .unwrap()
        .get("deepspeed_config_file");
    assert_eq!(
        file,
        Some(&Yaml::Str("/runs/it's here/deepspeed.json".into()))
    );
    let v = emit::hf_training_args(&s, &hyper);
    assert_eq!(v["deepspeed"], "/runs/it's here/deepspeed.json");
}

#[test]
fn profiles_toml_lowers_memory_and_keeps_the_batch() {
    let (arch, mut s) = setup(Zero::Z0, 1, false);
    s.grad_ckpt = false;
    let text = emit::profiles(&s);
    let t: toml::Table = toml::from_str(&text).unwrap();
    let list = t["profile"].as_array().unwrap();
    assert!(list.len() >= 3);
    let fw = memfit_plan::memory::Framework::default();
    let base_need = memfit_plan::memory::estimate(&arch, &s, &fw)
        .unwrap()
        .gpu
        .unwrap()
        .peak_allocated_bytes;
    for (p, (_, variant)) in list.iter().zip(emit::profile_setups(&s)) {
        assert!(p["name"].is_str());
        let args: Vec<&str> = p["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let batch: u64 = args[args.iter().position(|a| *a == "--batch").unwrap() + 1]
            .parse()
            .unwrap();
        let accum: u64 = args[args.iter().position(|a| *a == "--accum").unwrap() + 1]
            .parse()
            .unwrap();
        assert_eq!(batch * accum, s.batch * s.accum);
        assert!(p["env"].is_table());
        let need = memfit_plan::memory::estimate(&arch, &variant, &fw)
            .unwrap()
            .gpu
            .unwrap()
            .peak_allocated_bytes;
        assert!(need < base_need, "{} does not lower memory", p["name"]);
    }
}

#[test]
fn render_names_every_file() {
    let (arch, s) = setup(Zero::Z2, 2, false);
    let kinds = [
        Kind::Deepspeed,
        Kind::Accelerate,
        Kind::Hf,
        Kind::Memfit,
        Kind::Profiles,
    ];
    let files = emit::render(&kinds, &arch, &s, &Hyper::defaults("t5-base", &s));
    let names: Vec<_> = files.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "deepspeed.json",
            "accelerate.yaml",
            "training_args.json",
            "memfit-train.toml",
            "profiles.toml"
        ]
    );
    assert!(files.iter().all(|(_, t)| !t.is_empty()));
}
