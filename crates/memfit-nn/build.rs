//! `cfg(cube_kernels)`: memfit's own cubecl kernels are compiled (a GPU backend is, and burn's fusion,
//! which the kernels step aside for, is not). One name for a condition every kernel file states.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cube_kernels)");
    let on = |feature: &str| std::env::var_os(format!("CARGO_FEATURE_{feature}")).is_some();
    if (on("CUDA") || on("WGPU")) && !on("FUSION") {
        println!("cargo::rustc-cfg=cube_kernels");
    }
}
