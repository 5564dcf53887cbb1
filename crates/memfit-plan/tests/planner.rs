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
