//! cubecl's caches of compiled kernels and autotune results kept on disk between runs (CUDA builds
//! only). Without them every process compiles its kernels through NVRTC and autotunes each matmul
//! shape anew: on an H100 a run's first step took 9–17 s where the next took 0.06–1.4 s
//! (docs/gpu.md, Tables), at every start and every resume. cubecl keeps the autotune results
//! whenever it is built with `persistence`; the compiled kernels only where its configuration says
//! so, which is what this turns on before the first device is made.
//!
//! Where: cubecl's own choice (`target/environment` of the enclosing Cargo workspace, else the
//! user's cache directory), unless a `cubecl.toml` says otherwise. `MEMFIT_KERNEL_CACHE=off`
//! compiles every kernel afresh, as a build without the cache did.

use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

/// Turns the compiled-kernel cache on, keeping whatever else the user's `cubecl.toml` and
/// `CUBECL_*` variables set; nothing once cubecl has read its configuration (the first device
/// already made), nor under `MEMFIT_KERNEL_CACHE=off`.
pub fn keep_compiled_kernels() {
    if std::env::var("MEMFIT_KERNEL_CACHE").is_ok_and(|v| v == "off") {
        return;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.compilation.cache = true;
    CubeClRuntimeConfig::try_set(config);
}
