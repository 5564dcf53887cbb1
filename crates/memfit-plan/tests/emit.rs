//! Emitted configs carry only keys the tools accept, with the types they expect.

use memfit_plan::arch::preset;
use memfit_plan::emit::{self, Hyper, Kind};
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

/// accelerate's ClusterConfig / BaseConfig fields (accelerate/commands/config/config_args.py).
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
const ACCELERATE_DS_KEYS: &[&str] = &["deepspeed_config_file", "zero3_init_flag"];

#[test]
fn accelerate_yaml() {
    for (zero, gpus, offload) in [
        (Zero::Z0, 1, false),
        (Zero::Z0, 4, false),
        (Zero::Z3, 2, true),
        (Zero::FsdpFull, 2, false),
    ] {
        let (_, s) = setup(zero, gpus, offload);
        let y = emit::accelerate(&s);
        let mut section = None;
        for line in y.lines() {
            let nested = line.starts_with("  ");
            let (k, v) = line.trim().split_once(':').expect("key: value");
            let v = v.trim();
            if nested {
                let parent = section.expect("nested key under a section");
                if parent == "deepspeed_config" {
                    assert!(ACCELERATE_DS_KEYS.contains(&k), "{k}");
                } else {
                    assert!(k.starts_with("fsdp_"), "{k}");
                }
                continue;
            }
            let (_, ty) = ACCELERATE_KEYS
                .iter()
                .find(|(n, _)| *n == k)
                .unwrap_or_else(|| panic!("unknown accelerate key {k}"));
            match *ty {
                "int" => assert!(v.parse::<u64>().is_ok(), "{k}: {v}"),
                "bool" => assert!(v == "true" || v == "false", "{k}: {v}"),
                "map" => {
                    assert!(v.is_empty());
                    section = Some(k);
                }
                _ => assert!(!v.is_empty()),
            }
        }
        assert!(y.contains(&format!("num_processes: {gpus}\n")));
        let expected = match (zero, gpus) {
            (Zero::Z0, 1) => "NO",
            (Zero::Z0, _) => "MULTI_GPU",
            (Zero::FsdpFull, _) => "FSDP",
            _ => "DEEPSPEED",
        };
        assert!(
            y.contains(&format!("distributed_type: {expected}\n")),
            "{y}"
        );
    }
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
            _ => val.is_string(),
        };
        assert!(ok, "{k} = {val} is not {ty}");
    }
    assert!(HF_OPTIM.contains(&v["optim"].as_str().unwrap()));
    assert_eq!(v["per_device_train_batch_size"], 4);
    assert_eq!(v["deepspeed"], "deepspeed.json");
}

#[test]
fn memfit_train_toml() {
    let (_, s) = setup(Zero::Z0, 1, false);
    let text = emit::memfit_train(&s, &Hyper::defaults("chatlm-mini", &s));
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
    assert_eq!(t["precision"].as_str(), Some("amp-bf16"));
    assert!(t["lr"].is_float());
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
