//! What memfit itself costs: its CPU time and peak RSS.

/// /proc reports CPU times in USER_HZ ticks, which the kernel fixes at 100 per second for user space
/// (proc(5), "utime").
const USER_HZ: f64 = 100.0;

/// This process's user + system CPU time (fields 14 and 15 of /proc/self/stat).
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After ")", field N sits at index N − 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / USER_HZ)
}

/// This process's peak RSS (VmHWM).
pub fn own_peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    crate::probe::meminfo_kib(&status, "VmHWM").map(|k| k * 1024)
}
