//! `malloc_tuning` in a process of its own: it changes process-wide malloc settings.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use memfit_train::malloc_tuning::{keep_freed_memory, release_free, use_one_arena};

/// Resident bytes of this process (/proc/self/statm).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn freed_blocks_stay_resident_until_released() {
    const MIB: u64 = 1 << 20;
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        eprintln!("GLIBC_TUNABLES is set: keep_freed_memory leaves freeing to it, nothing to test");
        return;
    }
    use_one_arena();
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
}
