//! `scripts/gpu/tables.py`, which turns what `scripts/gpu/accept.sh` brings back from a GPU machine
//! into docs/gpu.md's tables: it runs once per lent card, so it is checked here on the files such a
//! run writes.

use std::path::Path;
use std::process::Command;

/// Six launches as cubecl's profiler (level basic) logs them: one line each, the kernel's name
/// holding `|` between its parts and ending in its specialisation's hash (the first five are lines
/// of a run on wgpu, the matmul's name shortened; the last a made-up long one).
const PROFILE: &str = "\
| 2.92861ms  | SelectKernel_e9b71f73
| 735.393µs  | KernelBinop | AddOp_921be900
| 602.036µs  | KernelBinop | AddOp_02cd17ff
| 1.314845ms | MatmulEntry | TensorArgs | DynamicScalar | __Lhs | SimpleMatmulFamily | RowMajorGlobalPartitionMatmul_e1b3b59b
| 540.265µs  | KernelScalarBinop | AddOp_15fe2222
| 1.5s       | KernelBinop | MulOp_c9f3026f
";

fn run(setup: &str, losses: &[f32]) -> String {
    let setup = format!(r#"{{"model": "tiny", "training": "Full", "precision": "{setup}"}}"#);
    format!(
        r#"{{"setup": {setup}, "losses": {losses:?}, "loss_first": {}, "loss_last": {}}}"#,
        losses[0],
        losses[losses.len() - 1]
    )
}

/// `records` as the JSON-lines file `name` in `dir`, as accept.sh writes its results.
fn write_jsonl(dir: &Path, name: &str, records: &[String]) {
    std::fs::write(dir.join(name), records.join("\n") + "\n").unwrap();
}

/// `md` (tables.py's output) holds `text`; on failure, the whole output.
fn assert_says(md: &str, text: &str) {
    assert!(md.contains(text), "{text:?} not in:\n{md}");
}

fn tables(dir: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu/tables.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A profile log written without a step count (before the steady-state pair): its totals over 5 steps.
#[test]
fn the_profile_counts_each_kernels_launches_and_time() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("profile-bert-small.log"), PROFILE).unwrap();
    let md = tables(dir.path());
    assert_says(
        &md,
        "301.2 ms of kernels a step, 1 launches a step (5 steps of one run",
    );
    // the two adds of different specialisations are one kernel; the matmul's name is shortened
    assert_says(&md, "| `KernelBinop AddOp` | 0 | 0.267 |");
    assert_says(
        &md,
        "| `MatmulEntry … RowMajorGlobalPartitionMatmul` | 0 | 0.263 |",
    );
    // the longest first
    let mul = md.find("KernelBinop MulOp").unwrap();
    assert!(mul < md.find("SelectKernel").unwrap(), "{md}");
}

/// The steady state: the 9-step run's totals less the 4-step run's, per step over the 5 between;
/// what only the first steps launched (an autotune's trial kernel) drops out.
#[test]
fn the_steady_state_profile_is_the_longer_run_less_the_shorter() {
    let dir = tempfile::tempdir().unwrap();
    let short = "\
| 100ms | MatmulEntry | TunerTrial_aaaaaaaa
| 1ms   | KernelBinop | AddOp_921be900
| 2ms   | KernelBinop | AddOp_921be900
| 1ms   | SelectKernel_e9b71f73
";
    // five more steps: an add of 1 ms and a select of 1 ms each
    let long = format!(
        "{short}{}",
        "| 1ms | KernelBinop | AddOp_02cd17ff\n| 1ms | SelectKernel_e9b71f73\n".repeat(5)
    );
    std::fs::write(dir.path().join("profile-t5-small-4.log"), short).unwrap();
    std::fs::write(dir.path().join("profile-t5-small-9.log"), long).unwrap();
    // the unprofiled speed run of the same model: 8 ms a step
    let speed = r#"{"setup": {"model": "t5-small", "batch": 32, "seq": 128}, "placement": "device",
        "sec_per_step_median": 0.008, "tokens_per_s": 512000, "model_flops_per_step": 1e12}"#;
    write_jsonl(dir.path(), "speed.jsonl", &[speed.replace('\n', " ")]);
    let md = tables(dir.path());
    assert_says(
        &md,
        "**t5-small** — 2.0 ms of kernels a step, 2 launches a step (steps 5–9",
    );
    assert_says(&md, "| `KernelBinop AddOp` | 1 | 1.000 | 50.0% |");
    assert_says(&md, "| `SelectKernel` | 1 | 1.000 | 50.0% |");
    assert!(!md.contains("TunerTrial"), "{md}");
    // 2 ms of kernels in an 8 ms step: the device waits 6 ms, 3 ms for each of the 2 launches
    assert_says(
        &md,
        "median step is 8.0 ms: the device computes 25% of it and waits 75% (the host's launches and reads), 3000.0 µs a launch",
    );
}

#[test]
fn parity_pairs_each_device_run_with_the_cpu_run_of_its_setup() {
    let dir = tempfile::tempdir().unwrap();
    let failed = r#"{"error": "precision bf16: no BF16 here", "exit": 2, "command": "memfit bench train --model t5"}"#;
    let device = [
        run("fp32", &[2.0, 1.5, 1.0]),
        run("bf16", &[2.0, 1.6, 1.2]),
        failed.to_string(),
    ];
    // the CPU's, finished in another order
    let cpu = [run("bf16", &[2.0, 1.6, 1.0]), run("fp32", &[2.0, 1.5, 1.0])];
    write_jsonl(dir.path(), "parity.jsonl", &device);
    write_jsonl(dir.path(), "parity-cpu.jsonl", &cpu);
    let md = tables(dir.path());
    assert_says(
        &md,
        "| tiny  | fp32 | 2.0000 → 1.0000 | 2.0000 → 1.0000 | 0.00e+00 | 0.0001 | yes |",
    );
    // bf16's last step is 20% off the CPU's: past its 1e-2
    assert_says(
        &md,
        "| tiny  | bf16 | 2.0000 → 1.2000 | 2.0000 → 1.0000 | 2.00e-01 | 0.01 | NO |",
    );
}

/// A run whose losses went NaN (memfit writes a non-finite loss as `null`, as an H100's bf16 LoRA
/// run once did) is a failed row, not a crash of the script that brings the card's figures back.
#[test]
fn a_nan_run_fails_its_parity_row() {
    let dir = tempfile::tempdir().unwrap();
    let setup = r#"{"model": "tiny", "training": "Full", "precision": "bf16"}"#;
    let nan = format!(
        r#"{{"setup": {setup}, "losses": [null, null], "loss_first": null, "loss_last": null}}"#
    );
    write_jsonl(dir.path(), "parity.jsonl", &[nan]);
    write_jsonl(dir.path(), "parity-cpu.jsonl", &[run("bf16", &[2.0, 1.0])]);
    let md = tables(dir.path());
    assert_says(
        &md,
        "| tiny  | bf16 | nan → nan | 2.0000 → 1.0000 | inf | 0.01 | NO |",
    );
}

/// The fusion build's speed rows are paired with the plain build's by setup, whatever the order.
#[test]
fn fusion_rows_pair_with_the_plain_builds_by_setup() {
    let dir = tempfile::tempdir().unwrap();
    let record = |model: &str, tokens: f64, loss: f64, nvml: u32| {
        format!(
            r#"{{"setup": {{"model": "{model}", "batch": 8, "seq": 64}}, "placement": "device", "tokens_per_s": {tokens}, "loss_last": {loss}, "nvml_peak_mib": {nvml}}}"#
        )
    };
    let plain = [
        record("t5-small", 1000.0, 2.0, 500),
        record("bert", 400.0, 1.0, 300),
    ];
    let fused = [
        record("bert", 1000.0, 1.001, 250),
        record("t5-small", 1500.0, 2.0, 450),
    ];
    write_jsonl(dir.path(), "speed.jsonl", &plain);
    write_jsonl(dir.path(), "speed-fusion.jsonl", &fused);
    let md = tables(dir.path());
    assert_says(
        &md,
        "| bert b8 s64 | 400 | 1000 | 2.50 | 300 | 250 | 1.0e-03 |",
    );
    assert_says(
        &md,
        "| t5-small b8 s64 | 1000 | 1500 | 1.50 | 500 | 450 | 0.0e+00 |",
    );
}

/// The fusion build's parity runs get a table of their own, paired with the same CPU runs; without
/// them there is no such table.
#[test]
fn the_fusion_builds_parity_has_its_own_table() {
    let dir = tempfile::tempdir().unwrap();
    write_jsonl(dir.path(), "parity.jsonl", &[run("bf16", &[2.0, 1.0])]);
    write_jsonl(dir.path(), "parity-cpu.jsonl", &[run("bf16", &[2.0, 1.0])]);
    let heading = "## Parity: the same 20 steps on the GPU (the `fusion` build) and on the CPU";
    assert!(!tables(dir.path()).contains(heading));
    write_jsonl(
        dir.path(),
        "parity-fusion.jsonl",
        &[run("bf16", &[2.0, 1.05])],
    );
    let md = tables(dir.path());
    let fused = &md[md.find(heading).expect("the fusion build's table")..];
    assert_says(
        fused,
        "| tiny  | bf16 | 2.0000 → 1.0500 | 2.0000 → 1.0000 | 5.00e-02 | 0.01 | NO |",
    );
}

/// The preflight's second run, a new process whose kernels come from cubecl's disk cache, is said
/// as such beside the first.
#[test]
fn the_second_preflight_is_the_cached_start() {
    let dir = tempfile::tempdir().unwrap();
    let preflight = |first: f64| {
        format!(r#"{{"device": "cuda:0", "wall_s": 11, "step_seconds": [{first}, 0.07, 0.066]}}"#)
    };
    write_jsonl(
        dir.path(),
        "preflight.jsonl",
        &[preflight(9.04), preflight(0.8)],
    );
    let md = tables(dir.path());
    assert_says(
        &md,
        "Preflight: the tiny T5 trained 4 steps on cuda:0 in 11 s (first step 9.04 s; then 0.066 s).",
    );
    assert_says(
        &md,
        "Again, in a second process (kernels from the disk cache): trained 4 steps on cuda:0 in 11 s (first step 0.80 s;",
    );
}

/// Where memfit's GPU kernels failed the first preflight and the script went on without them, the
/// tables say so first, with why.
#[test]
fn tables_say_when_memfits_gpu_kernels_were_off() {
    let dir = tempfile::tempdir().unwrap();
    write_jsonl(dir.path(), "preflight.jsonl", &[]);
    std::fs::write(
        dir.path().join("gpu-kernels-off"),
        "NVRTC: error in norm_kernel\n",
    )
    .unwrap();
    let md = tables(dir.path());
    assert_says(&md, "memfit's own GPU kernels were off");
    assert_says(&md, "NVRTC: error in norm_kernel");
    let dir = tempfile::tempdir().unwrap();
    write_jsonl(dir.path(), "preflight.jsonl", &[]);
    assert!(!tables(dir.path()).contains("were off"));
}

/// The issue's speed table: each memfit shape beside PyTorch eager and the fastest compiled mode,
/// paired by PyTorch's bench name whatever order the records came in.
#[test]
fn speed_rows_set_memfit_beside_pytorch_eager_and_its_fastest_compiled_mode() {
    let dir = tempfile::tempdir().unwrap();
    let memfit = |model: &str, tokens: f64, nvml: u32| {
        format!(
            r#"{{"setup": {{"model": "{model}", "batch": 32, "seq": 128}}, "placement": "device", "tokens_per_s": {tokens}, "nvml_peak_mib": {nvml}, "sec_per_step_median": 0.01, "model_flops_per_step": 1e12, "step_seconds": [2.0, 0.01]}}"#
        )
    };
    let torch = |bench: &str, mode: &str, tokens: f64, nvml: u32| {
        format!(
            r#"{{"bench": "{bench}", "compile": "{mode}", "tokens_per_s": {tokens}, "nvml_peak_mib": {nvml}}}"#
        )
    };
    let records = [
        memfit("t5-small", 3000.0, 900),
        memfit("bert-base-chinese", 2000.0, 1000),
        torch("bert_cls", "none", 1000.0, 2000),
        torch("t5", "none", 2000.0, 1800),
        torch("t5", "reduce-overhead", 4000.0, 1900),
        torch("t5", "default", 2500.0, 1700),
        torch("bert_cls", "reduce-overhead", 1600.0, 2100),
    ];
    write_jsonl(dir.path(), "speed.jsonl", &records);
    let md = tables(dir.path());
    assert_says(
        &md,
        "| shape | memfit tokens/s | PyTorch eager tokens/s | ratio | PyTorch compiled tokens/s | ratio | memfit NVML MiB | PyTorch eager NVML MiB | ratio | memfit MFU |",
    );
    // t5: eager 2000 (1.50×), compiled's best is reduce-overhead's 4000 (0.75×), NVML 900 / 1800
    assert_says(
        &md,
        "| t5-small b32 s128 | 3000 | 2000 | 1.50 | 4000 | 0.75 | 900 | 1800 | 0.50 | — |",
    );
    assert_says(
        &md,
        "| bert-base-chinese b32 s128 | 2000 | 1000 | 2.00 | 1600 | 1.25 | 1000 | 2000 | 0.50 | — |",
    );
    assert_says(
        &md,
        "| t5-small b32 s128 | — | 2.00 / 0.010 | reduce-overhead | 1900 |",
    );
}

/// Each product memfit timed beside torch.matmul's time for the same shape and layout; the step's
/// products summed both ways; the largest share first.
#[test]
fn matmul_rows_pair_memfits_products_with_torchs() {
    let dir = tempfile::tempdir().unwrap();
    let setup =
        r#"{"model": "t5-small", "method": "full", "batch": 32, "seq": 128, "precision": "bf16"}"#;
    let product = |what: &str, m: u32, seconds: f64, count: u32| {
        format!(
            r#"{{"what": "{what}", "pass": "forward", "batch": 1, "m": {m}, "k": 512, "n": 512, "lhs_t": false, "rhs_t": false, "count": {count}, "layout": "NN", "seconds_median": {seconds}, "tflops": 1.0, "setup": {setup}}}"#
        )
    };
    let theirs = |m: u32, seconds: f64| {
        format!(
            r#"{{"pass": "forward", "batch": 1, "m": {m}, "k": 512, "n": 512, "lhs_t": false, "rhs_t": false, "torch_seconds_median": {seconds}, "torch_tflops": 2.0, "setup": {setup}}}"#
        )
    };
    write_jsonl(
        dir.path(),
        "matmul.jsonl",
        &[product("small", 64, 1e-5, 1), product("big", 4096, 1e-4, 3)],
    );
    write_jsonl(
        dir.path(),
        "matmul-torch.jsonl",
        &[theirs(4096, 5e-5), theirs(64, 2e-5)],
    );
    let md = tables(dir.path());
    // memfit 0.31 ms (1e-5 + 3e-4), torch 0.17 ms (2e-5 + 1.5e-4)
    assert_says(
        &md,
        "**t5-small** b32 s128 (full): 2 products, 0.31 ms a step one after the other; torch.matmul 0.17 ms (ratio 0.55).",
    );
    assert_says(
        &md,
        "| big | forward | NN | 1 × 4096 × 512 × 512 | 3 | 100.0 | 50.0 | 0.50 | 1.0 | 2.0 | 96.8% |",
    );
    assert!(
        md.find("| big |").unwrap() < md.find("| small |").unwrap(),
        "{md}"
    );
}
