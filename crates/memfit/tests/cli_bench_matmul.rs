//! `memfit bench matmul` through the binary: the products it times are the step `bench train`
//! counts, and what it cannot list is refused.

use std::process::{Command, Output};

fn memfit(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args.split_whitespace())
        .output()
        .expect("memfit runs")
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (String::from_utf8_lossy(&o.stdout).lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The tiny T5's products, each timed, add up to the FLOPs `bench train` reports for its step.
#[test]
fn the_products_timed_are_the_step_bench_train_counts() {
    let shape = "--model tiny --batch 2 --seq 8 --tgt-seq 4 --precision fp32 --device cpu";
    let products = json_lines(&memfit(&format!("bench matmul {shape} --iters 2 --json")));
    assert!(products.len() > 10, "{products:?}");
    let mut flops = 0.0;
    for p in &products {
        assert!(p["seconds_median"].as_f64().unwrap() > 0.0, "{p}");
        let dims = ["batch", "m", "k", "n", "count"].map(|k| p[k].as_f64().unwrap());
        flops += 2.0 * dims.iter().product::<f64>();
        assert!(
            ["NN", "NT", "TN"].contains(&p["layout"].as_str().unwrap()),
            "{p}"
        );
    }
    let train = json_lines(&memfit(&format!("bench train {shape} --steps 4 --json")));
    let counted = train[0]["model_flops_per_step"].as_f64().unwrap();
    assert!((flops / counted - 1.0).abs() < 1e-9, "{flops} vs {counted}");
}

#[test]
fn a_model_memfit_does_not_train_or_an_empty_shape_is_refused() {
    let o = memfit("bench matmul --model gpt2 --batch 1 --seq 8 --device cpu");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Gpt2"));
    let o = memfit("bench matmul --model tiny --batch 0 --seq 8 --device cpu");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--batch"));
}
