//! `malloc_tuning` in a process of its own, without the test harness's threads (`harness = false`):
//! its settings are process-wide, and `memfit`'s main makes them before any thread exists.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use memfit_train::malloc_tuning::{
        keep_freed_memory, release_free, tuned_by_environment, use_one_arena,
    };

    /// Resident bytes of this process (/proc/self/statm).
    fn rss() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        // SAFETY: sysconf reads a constant.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
    }

    const MIB: u64 = 1 << 20;
    use_one_arena();
    if tuned_by_environment() {
        println!(
            "malloc is tuned by the environment: keep_freed_memory leaves it, nothing to test"
        );
        return;
    }
    keep_freed_memory();
    let before = rss();
    // 48 MiB: above glibc's largest mmap threshold, so by default unmapped when freed
    let block = vec![1u8; 48 * MIB as usize];
    std::hint::black_box(&block);
    let held = rss();
    assert!(
        held >= before + 44 * MIB,
        "the block is resident: {before} → {held}"
    );
    drop(block);
    let freed = rss();
    assert!(
        freed + 4 * MIB >= held,
        "a freed block stays for the next step: {held} → {freed}"
    );
    release_free();
    let released = rss();
    assert!(
        released + 44 * MIB <= held,
        "release_free hands it back: {held} → {released}"
    );
    println!("freed blocks stay resident until released: ok");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {}
