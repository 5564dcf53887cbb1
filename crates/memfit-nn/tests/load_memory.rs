//! Loading a ~420 MB f32 checkpoint does not hold it twice: the peak RSS while loading stays within
//! 1.1× of the RSS once loaded (the file is read tensor by tensor into the f32 buffers; a mapped
//! file's pages would count in RSS beside them). Its own main, without the test harness: the peak
//! (VmHWM) is process-wide, so nothing else may run while it is measured.

use memfit_nn::t5::{T5Config, T5Model};
use serde_json::json;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"))
}

fn main() {
    // t5-base's widths with 6 + 6 layers and d_ff 2048: 105 M parameters, 420 MB in f32.
    let config = T5Config::from_json(&json!({
        "model_type": "t5", "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 2048,
        "num_layers": 6, "num_decoder_layers": 6, "num_heads": 12
    }))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bytes = {
        let model = T5Model::init(config, 3);
        model.save(dir.path()).unwrap();
        model
            .weights
            .iter()
            .map(|w| w.len() as u64 * 4)
            .sum::<u64>()
    };
    assert!(
        bytes > 400 << 20,
        "checkpoint of {bytes} bytes is smaller than meant"
    );
    // Reset the peak to the current RSS (proc(5): writing 5 to clear_refs resets VmHWM).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let (loaded, _) = T5Model::load(dir.path()).unwrap();
    let (peak, rss) = (status_kib("VmHWM:"), status_kib("VmRSS:"));
    println!(
        "loaded {} MiB of weights: RSS {} MiB, peak while loading {} MiB ({:.3}x)",
        bytes >> 20,
        rss >> 10,
        peak >> 10,
        peak as f64 / rss as f64
    );
    assert!(
        (peak as f64) <= 1.1 * rss as f64,
        "peak RSS {peak} KiB while loading is more than 1.1x the loaded RSS {rss} KiB"
    );
    assert_eq!(loaded.weights.len(), loaded.layout.specs.len());
    println!("1 passed, 0 failed");
}
