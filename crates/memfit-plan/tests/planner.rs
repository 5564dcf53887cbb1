//! The planner and the tier table on presets (generated setups, no fixtures).

use memfit_plan::arch::preset;
use memfit_plan::memory::{Framework, Method, Setup};
use memfit_plan::search::{Budget, Request, plan, tiers};

fn request(model: &str, gpu_gib: Option<u64>, host_gib: u64) -> (memfit_plan::arch::Arch, Request) {
    let arch = preset(model).unwrap();
    let base = Setup::new(&arch);
    let req = Request {
        base,
        target_batch: 32,
        budget: Budget {
            gpu_bytes: gpu_gib.map(|g| g << 30),
            host_bytes: host_gib << 30,
            headroom: 0.1,
        },
    };
    (arch, req)
}

#[test]
fn the_choice_fits_holds_the_batch_and_is_fastest() {
    let (arch, req) = request("chatlm-mini", Some(8), 16);
    let p = plan(&arch, &req, &Framework::default()).unwrap();
    let c = p.chosen.expect("a setup fits 8 GiB");
    assert_eq!(c.setup.batch * c.setup.accum * c.setup.world(), 32);
    assert!(c.gpu_need().unwrap() <= (8u64 << 30) * 9 / 10);
    assert!(c.host_need() <= (16u64 << 30) * 9 / 10);
    for alt in &p.alternatives {
        assert!(alt.tokens_per_s <= c.tokens_per_s);
        assert!(alt.rejected.is_none());
    }
    for r in &p.rejected {
        assert!(r.tokens_per_s >= c.tokens_per_s);
        assert!(r.rejected.as_deref().unwrap().contains("GiB"));
    }
}

#[test]
fn more_gpu_memory_never_makes_the_plan_slower() {
    let mut last = 0.0;
    for gib in [4, 8, 16, 24, 80] {
        let (arch, req) = request("bert-base-chinese", Some(gib), 32);
        let p = plan(&arch, &req, &Framework::default()).unwrap();
        let speed = p.chosen.map_or(0.0, |c| c.tokens_per_s);
        assert!(speed >= last, "{gib} GiB: {speed} < {last}");
        last = speed;
    }
}

#[test]
fn nothing_fits_gives_a_reason() {
    let (arch, req) = request("llama-2-7b", Some(4), 8);
    let p = plan(&arch, &req, &Framework::default()).unwrap();
    assert!(p.chosen.is_none());
    assert!(p.reason.unwrap().contains("nothing fits"));
}

#[test]
fn target_batch_must_divide_over_gpus() {
    let (arch, mut req) = request("gpt2", Some(24), 32);
    req.base.gpus = 3;
    req.target_batch = 32;
    assert!(plan(&arch, &req, &Framework::default()).is_err());
}

#[test]
fn tier_table_snapshot() {
    let arch = preset("chatlm-mini").unwrap();
    let t = tiers::tier_table(&arch, &Setup::new(&arch), 32, 0.1, &Framework::default()).unwrap();
    insta::assert_snapshot!("chatlm_mini_tiers", t.markdown());
    let arch = preset("qwen2.5-0.5b").unwrap();
    let mut base = Setup::new(&arch);
    base.method = Method::Lora;
    let t = tiers::tier_table(&arch, &base, 32, 0.1, &Framework::default()).unwrap();
    insta::assert_snapshot!("qwen_lora_tiers", t.markdown());
}

/// An offload is only chosen when it buys something: wherever the same setup without it fits, the
/// plan takes that one (the offload's PCIe traffic costs time). The one-GPU LoRA case picked ZeRO-2
/// with optimizer offload to move 0.01 GiB of adapter states off the GPU.
#[test]
fn an_offload_that_buys_nothing_loses_to_the_setup_without_it() {
    let fw = Framework::default();
    for (model, method, gpu_gib) in [
        ("qwen2.5-0.5b", Method::Lora, [8u64, 12, 24, 80]),
        ("chatlm-mini", Method::Full, [4, 8, 16, 80]),
    ] {
        for gib in gpu_gib {
            let (arch, mut req) = request(model, Some(gib), 64);
            req.base.method = method;
            let arch = arch.with_task(req.base.task);
            let p = plan(&arch, &req, &fw).unwrap();
            let c = p.chosen.expect("a setup fits");
            if !c.setup.offload_optimizer {
                continue;
            }
            let mut plain = c.setup.clone();
            plain.offload_optimizer = false;
            plain.offload_params = false;
            // the planner's test of fit: the need widened by the setup class's validation band
            let plain_need = memfit_plan::memory::estimate(&arch, &plain, &fw)
                .unwrap()
                .gpu
                .unwrap()
                .nvml_used_bytes;
            let need = memfit_plan::memory::band::high(plain_need, &plain);
            assert!(
                need > req.budget.usable_gpu().unwrap(),
                "{model} {gib} GiB: chose {} although it fits without the offload",
                c.summary()
            );
        }
    }
    // the LoRA case itself: the adapters' offload moved 0.01 GiB; the choice has none
    let (arch, mut req) = request("qwen2.5-0.5b", Some(24), 64);
    req.base.method = Method::Lora;
    let arch = arch.with_task(req.base.task);
    let c = plan(&arch, &req, &fw).unwrap().chosen.unwrap();
    assert!(!c.setup.offload_optimizer, "{}", c.summary());
}

#[test]
fn offload_traffic_grows_with_accumulation() {
    use memfit_plan::search::throughput::offload_pcie_bytes;
    let arch = preset("chatlm-mini").unwrap();
    let mut s = Setup::new(&arch);
    s.offload_optimizer = true;
    s.zero = memfit_plan::memory::Zero::Z2;
    s.precision = memfit_plan::memory::Precision::AmpBf16;
    s.accum = 1;
    // one micro-batch: 16-bit gradients down, 16-bit weights up
    assert_eq!(offload_pcie_bytes(1000.0, &s), 4000.0);
    s.accum = 4;
    // each later micro-batch: the running sum up and the new gradients down
    assert_eq!(offload_pcie_bytes(1000.0, &s), 16000.0);
}
