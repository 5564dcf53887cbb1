//! How glibc's malloc serves the trainer: one arena, and freed memory kept for the next step.
//!
//! - **One arena.** glibc gives each thread that allocates its own arena. A training step runs
//!   inside rayon's pool ([`crate::engine`]), so its tensors are allocated on several threads,
//!   and memory a step frees in one arena cannot serve the next step's allocations on another
//!   thread: measured on the tiny T5 at micro-batch 16 × 128 tokens, 2 threads, peak RSS 765 MiB
//!   with per-thread arenas and 448 MiB with one, at the same CPU time (the trainer's allocations
//!   are few and large, so the shared arena's lock is not contended).
//! - **Freed memory kept.** Every step allocates and frees the same few GiB (activations,
//!   gradients). By default glibc maps blocks above its mmap threshold (at most 32 MiB) on their
//!   own and unmaps them when freed, and trims the heap's free top, so each step faults the same
//!   pages in again, and the kernel zeroes them: on chatlm-mini b4 s256 bf16, 2.1 M page faults
//!   and 6.4 s of system time for 7 steps, against 1.1 M and 4.0 s (most of them the start-up's)
//!   with blocks from the heap and no trimming — the same peak RSS, since a step reuses what the
//!   last one freed. The memory guard already expects RSS to stay near its high-water mark
//!   ([`crate::memory_guard`]); after a downgrade the loop hands free memory back
//!   ([`release_free`]).
//!
//! The first holds for every command; the second only for the training ones (`memfit train`,
//! `memfit bench train`). Whoever tunes malloc through the environment (`GLIBC_TUNABLES`, or the
//! older `MALLOC_*` variables) keeps their settings: the second one is left to them.

/// Makes glibc's malloc use one arena (every memfit command); call before other threads start.
/// Elsewhere a no-op.
pub fn use_one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt changes a malloc setting; M_ARENA_MAX = 1 is valid at any time (arenas
    // already created stay in use), and it is called before the process starts its threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Makes glibc's malloc keep freed memory for reuse, unless malloc is tuned through the
/// environment ([`tuned_by_environment`]): for the training commands, whose steps repeat the same
/// allocations (not for streaming ones such as `memfit data`, whose buffers vary). Elsewhere a
/// no-op.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !tuned_by_environment() {
        // SAFETY: mallopt changes malloc settings, valid at any time (blocks already mapped stay
        // mapped until freed).
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            // -1: never trim (mallopt(3))
            libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
        }
    }
}

/// Whether `GLIBC_TUNABLES` or one of glibc's `MALLOC_*` variables (mallopt(3)) is set.
pub fn tuned_by_environment() -> bool {
    std::env::vars_os().any(|(name, _)| {
        name.to_str()
            .is_some_and(|n| n == "GLIBC_TUNABLES" || n.starts_with("MALLOC_"))
    })
}

/// Hands the heap's free pages back to the kernel (after the trainer sheds memory).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}
