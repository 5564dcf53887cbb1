//! `memfit train`'s planned start as a user runs it: a smaller budget plans a leaner start with the
//! same effective batch, flags are constraints, exit 3 when nothing fits, bad budgets → exit 2, and
//! a run's plan.json / config.toml carry the plan and its budget.

use std::process::{Command, Output};

fn memfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .output()
        .unwrap()
}

/// A run.toml whose batch and accumulation the planner may change (they are not flags).
fn config_file(dir: &std::path::Path) -> String {
    let path = dir.join("run.toml");
    std::fs::write(&path, "model = \"t5-small\"\nbatch = 16\naccum = 2\n").unwrap();
    path.display().to_string()
}

/// `--plan-only --json` of t5-small at 256 + 256 tokens with `extra` flags: (exit code, planning).
fn plan(config: &str, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let mut args = vec![
        "train",
        "--plan-only",
        "--json",
        "--config",
        config,
        "--seq",
        "256",
        "--tgt-seq",
        "256",
    ];
    args.extend_from_slice(extra);
    let out = memfit(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), v, stderr)
}

fn chosen(v: &serde_json::Value) -> (u64, u64, bool) {
    let s = &v["chosen"]["settings"];
    (
        s["batch"].as_u64().unwrap(),
        s["accum"].as_u64().unwrap(),
        s["grad_ckpt"].as_bool().unwrap(),
    )
}

#[test]
fn a_smaller_budget_plans_a_leaner_start_and_keeps_the_effective_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let (code, roomy, err) = plan(&config, &["--budget-ram", "64GiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("planned start (auto"), "{err}");
    let (code, tight, err) = plan(&config, &["--budget-ram", "3GiB"]);
    assert_eq!(code, 0, "{err}");
    let (rb, ra, rc) = chosen(&roomy);
    let (tb, ta, tc) = chosen(&tight);
    assert_eq!(rb * ra, 32);
    assert_eq!(tb * ta, 32);
    assert!(
        tb < rb || (tc && !rc),
        "roomy {rb}×{ra} ckpt {rc}, tight {tb}×{ta} ckpt {tc}"
    );
    let peak = |v: &serde_json::Value| v["predicted_peak_rss_bytes"].as_u64().unwrap();
    // planned below the memory guard's soft limit (85% of the budget by default)
    assert!(peak(&tight) <= tight["planned_below_bytes"].as_u64().unwrap());
    assert!(tight["planned_below_bytes"].as_u64().unwrap() < 3 << 30);
    assert!(peak(&tight) < peak(&roomy));
    assert_eq!(tight["budget"]["ram_bytes"], 3u64 << 30);
    assert!(tight["alternatives"].is_array());
}

#[test]
fn explicit_flags_are_respected_as_constraints() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    // unconstrained, a roomy budget takes the whole effective batch (16 × 2) in one micro-batch
    let (code, v, err) = plan(&config, &["--budget-ram", "64GiB"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(chosen(&v), (32, 1, false));
    // --batch 8 fixes the micro-batch; the effective batch is then 8 × the configured accum 2
    let (code, v, err) = plan(&config, &["--budget-ram", "64GiB", "--batch", "8"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(chosen(&v), (8, 2, false));
    assert_eq!(v["fixed_by_flags"]["batch"], 8);
    let (code, v, err) = plan(&config, &["--budget-ram", "64GiB", "--grad-ckpt"]);
    assert_eq!(code, 0, "{err}");
    assert!(chosen(&v).2);
    assert_eq!(v["fixed_by_flags"]["grad_ckpt"], true);
}

#[test]
fn nothing_fits_exits_3_with_the_shortfall() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let (code, _, err) = plan(&config, &["--budget-ram", "300MiB"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("nothing fits") && err.contains("300MiB"),
        "{err}"
    );
}

/// A budget past the machine's memory is refused before anything is made (it used to make the
/// whole run directory, then fail mapping the memory reserve, naming no budget). `--plan-only`
/// may still plan for a larger machine (the tests above plan 64 GiB on any box).
#[test]
fn a_budget_past_the_machine_is_refused_and_nothing_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out_arg = out_dir.display().to_string();
    let out = memfit(&[
        "train",
        "--demo",
        "classification",
        "--budget-ram",
        "1TiB",
        "--out",
        &out_arg,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--budget-ram 1TiB")
            && err.contains("1024.00 GiB")
            && err.contains("this machine's"),
        "{err}"
    );
    assert!(!out_dir.exists(), "a refused start made {out_arg}");
}

#[test]
fn bad_budgets_and_policies_exit_2_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    for (flags, named) in [
        (&["--budget-ram", "lots"][..], "lots"),
        (&["--budget-ram", "250%"][..], "250%"),
        (&["--budget", "0"][..], "\"0\""),
        // a bare number was 10 bytes ("0.00 GiB"): it asks for a unit or a percentage now
        (&["--budget-ram", "10"][..], "10GiB"),
        (&["--budget-ram", "10"][..], "10%"),
        (&["--budget-gpu", "10"][..], "has no unit"),
        (&["--budget-gpu", "8 parsecs"][..], "8 parsecs"),
        (&["--policy", "chatlm-v9"][..], "chatlm-v9"),
    ] {
        let (code, _, err) = plan(&config, flags);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains(named), "{flags:?}: {err}");
    }
}

#[test]
fn chatlm_v3_policy_decision_is_printed_and_planned() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let (code, v, err) = plan(&config, &["--policy", "chatlm-v3", "--budget-ram", "64GiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("chatlm-v3"), "{err}");
    assert_eq!(v["policy"], "chatlm-v3");
    assert!(v["policy_source"].as_str().unwrap().contains("5d716e6"));
    // below 13 GiB available: 1 × 8; above: the configured 16 × 2 bounded to at most 2 × at least 16
    let avail = v["available_bytes"].as_u64().unwrap();
    let expected = if avail < 13 << 30 { (1, 8) } else { (2, 16) };
    let (batch, accum, _) = chosen(&v);
    assert_eq!((batch, accum), expected);
}

#[test]
fn chatlm_v8_policy_decision_is_printed_and_planned() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let (code, v, err) = plan(&config, &["--policy", "chatlm-v8", "--budget-ram", "64GiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("chatlm-v8"), "{err}");
    assert_eq!(v["policy"], "chatlm-v8");
    // the table's threshold is 10 GiB of available memory: the decision follows this machine
    let avail = v["available_bytes"].as_u64().unwrap();
    let expected_accum = if avail < 10 << 30 { 4 } else { 2 };
    assert_eq!(chosen(&v).1, expected_accum);
    assert_eq!(chosen(&v).0, 16);
}

/// Under `memfit run` the trainer plans for the supervisor's budget up to its soft limit (it used
/// to plan for 80% of RAM and be SIGKILLed mid-step at the supervisor's hard limit); a budget of
/// its own above that one is brought down to it, with a warning.
#[test]
fn under_memfit_run_the_trainer_plans_for_the_supervisors_budget() {
    let dir = tempfile::tempdir().unwrap();
    let soft = (1024.0 * 1024.0 * 1024.0 * 0.9) as u64; // --budget 1GiB, --soft 90% (its default)
    for own in [None, Some("2GiB")] {
        let run = dir.path().join(format!("run-{}", own.unwrap_or("none")));
        let mut args = vec![
            "run",
            "--budget",
            "1GiB",
            "--",
            env!("CARGO_BIN_EXE_memfit"),
        ];
        args.extend(["train", "--out", run.to_str().unwrap(), "--max-steps", "1"]);
        args.extend(["--threads", "1", "--eval-rows", "2"]);
        if let Some(own) = own {
            args.extend(["--budget-ram", own]);
        }
        let out = memfit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("plan.json")).unwrap()).unwrap();
        let budget = &plan["planning"]["budget"];
        assert_eq!(budget["ram_bytes"], soft, "{own:?}");
        let source = budget["ram_source"].as_str().unwrap();
        assert!(
            source.contains("memfit run") && source.contains("MEMFIT_RUN_BUDGET_BYTES"),
            "{source}"
        );
        let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
        assert!(
            config.contains(&format!("memory_budget_bytes = {soft}")),
            "{config}"
        );
        if own.is_some() {
            assert!(
                err.contains("--budget-ram 2GiB") && err.contains("above"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_run_writes_its_plan_and_budget() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = memfit(&[
        "train",
        "--out",
        run.to_str().unwrap(),
        "--max-steps",
        "1",
        "--threads",
        "1",
        "--eval-rows",
        "2",
        "--budget-ram",
        "2GiB",
        "--budget-gpu",
        "4GiB",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("plan.json")).unwrap()).unwrap();
    for key in ["model", "setup", "host"] {
        assert!(!plan[key].is_null(), "plan.json lacks {key}");
    }
    let planning = &plan["planning"];
    assert_eq!(planning["policy"], "auto");
    assert_eq!(planning["budget"]["ram_bytes"], 2u64 << 30);
    assert_eq!(planning["budget"]["ram_source"], "--budget-ram 2GiB");
    assert!(planning["considered"].as_u64().unwrap() > 1);
    assert_eq!(planning["data_loading"]["workers"], 0);
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains(&format!("memory_budget_bytes = {}", 2u64 << 30)),
        "{config}"
    );
    // the GPU budget reaches the guard's settings through the config
    assert!(
        config.contains(&format!("gpu_memory_budget_bytes = {}", 4u64 << 30)),
        "{config}"
    );
    assert_eq!(planning["budget"]["gpu_bytes"], 4u64 << 30);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["budget_bytes"], 2u64 << 30);
}

#[test]
fn a_config_file_budget_counts_when_no_flag_gives_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(
        &path,
        "model = \"t5-small\"\nbatch = 16\naccum = 2\nmemory_budget_bytes = 3221225472\n",
    )
    .unwrap();
    let config = path.display().to_string();
    let (code, v, err) = plan(&config, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["budget"]["ram_bytes"], 3u64 << 30, "{v}");
    // the flag still wins over the file
    let (code, v, err) = plan(&config, &["--budget-ram", "4GiB"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["budget"]["ram_bytes"], 4u64 << 30);
}

/// A decoder under LoRA is estimated by memfit's own host model (`memfit estimate --runtime memfit
/// --device cpu --method lora`), and `memfit train --budget-ram` plans it: a tighter budget gets a
/// smaller micro-batch (or checkpointing) for the same effective batch, below the budget.
#[test]
fn a_lora_decoder_is_estimated_and_planned_under_a_budget() {
    let out = memfit(&[
        "estimate",
        "--model",
        "qwen2.5-0.5b",
        "--batch",
        "4",
        "--seq",
        "512",
        "--method",
        "lora",
        "--lora-r",
        "16",
        "--lora-targets",
        "q,k,v,o,gate,up,down",
        "--base-precision",
        "bf16",
        "--runtime",
        "memfit",
        "--device",
        "cpu",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let peak = v["host"]["peak_rss_bytes"].as_u64().unwrap();
    // the bf16 base alone is ~1 GB; activations of 2048 tokens through 24 blocks add a few GB
    assert!(peak > 2 << 30 && peak < 16 << 30, "{peak}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(
        &path,
        "model = \"qwen2.5-0.5b\"\nmethod = \"lora\"\nbase_precision = \"bf16\"\nbatch = 16\n",
    )
    .unwrap();
    let config = path.display().to_string();
    let plan = |budget: &str| {
        let out = memfit(&[
            "train",
            "--plan-only",
            "--json",
            "--config",
            &config,
            "--seq",
            "512",
            "--budget-ram",
            budget,
        ]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("planned start (auto"), "{err}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (roomy, tight) = (plan("64GiB"), plan("6GiB"));
    let (rb, ra, rc) = chosen(&roomy);
    let (tb, ta, tc) = chosen(&tight);
    assert_eq!((rb * ra, tb * ta), (16, 16));
    assert!(
        tb < rb || (tc && !rc),
        "roomy {rb}×{ra} ckpt {rc}, tight {tb}×{ta} ckpt {tc}"
    );
    let peak = tight["predicted_peak_rss_bytes"].as_u64().unwrap();
    assert!(peak <= tight["planned_below_bytes"].as_u64().unwrap());
}
