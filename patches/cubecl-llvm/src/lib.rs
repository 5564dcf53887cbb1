//! The items cubecl-cuda 0.11 uses from `cubecl-llvm`, with no LLVM behind them.
//!
//! cubecl-cuda always compiles two kernel compilers: CUDA C++ through NVRTC and LLVM IR through
//! pliron and LLVM. Its `cpp` feature, which memfit's `cuda` build turns on, makes NVRTC the one that
//! runs; the LLVM one is then only named, never called. The real `cubecl-llvm` downloads an LLVM
//! bundle in its build script, which fails offline, so memfit patches it with this crate. Asking it to
//! compile anything is an error that says so.

use core::fmt;

use cubecl_core::ir::nvidia::SmArch;
use cubecl_core::prelude::KernelDefinition;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::kernel::BufferIOAttr;

pub mod nvptx {
    pub mod ptx_version {
        use core::fmt;

        /// A PTX ISA version as the NVPTX target names it (8.7 is `87`). cubecl-cuda reads it
        /// only for the LLVM compiler's options and its cache key.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct PtxVersion(u32);

        impl PtxVersion {
            /// The PTX version the LLVM compiler would emit for this driver. `None` ("LLVM's
            /// default"): there is no LLVM compiler in this build, and NVRTC picks its own.
            pub fn for_driver(_driver: i32) -> Option<Self> {
                None
            }
        }

        impl fmt::Display for PtxVersion {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "ptx{}", self.0)
            }
        }
    }
}

pub mod shared {
    pub mod lowered_features {
        use cubecl_core::ir::DeviceProperties;

        /// The GPU a device's advertised features would be narrowed for.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum GpuTarget {
            Nvptx,
        }

        /// cubecl-cuda narrows a device's features only when the LLVM compiler runs, which never
        /// happens in this build: nothing to narrow.
        pub fn restrict_features(_props: &mut DeviceProperties, _target: GpuTarget) {}
    }
}

/// Which code the LLVM compiler would emit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Cpu,
    Nvptx,
}

/// The LLVM compiler's options, as cubecl-cuda fills them.
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    pub arch: Option<()>,
    pub sm_arch: Option<SmArch>,
    pub ptx_version: Option<nvptx::ptx_version::PtxVersion>,
    pub grid_constants: bool,
}

/// A compiled PTX module (never produced here).
#[derive(Clone, Debug)]
pub struct NvptxModule {
    /// NUL-terminated PTX assembly.
    pub ptx: Vec<core::ffi::c_char>,
    pub ir: String,
    pub shared_memory_size: usize,
    pub io: Vec<BufferIOAttr>,
}

/// What the LLVM compiler returns.
#[derive(Debug)]
pub enum PlironArtifact {
    NvptxCode(NvptxModule),
    /// The real crate's CPU JIT; kept so a match over artifacts has its other arm.
    Unavailable,
}

/// The LLVM compiler: every call is an error naming the reason.
#[derive(Clone, Debug)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

impl PlironCompiler {
    pub fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &PlironOptions,
    ) -> Result<PlironArtifact, CompilationError> {
        Err(CompilationError::Validation {
            reason: Unbuilt.to_string(),
            backtrace: Default::default(),
        })
    }

    pub fn lang_tag(&self) -> &'static str {
        "llvm"
    }
}

struct Unbuilt;

impl fmt::Display for Unbuilt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "cubecl's LLVM kernel compiler is not part of this build (memfit compiles CUDA kernels \
             with NVRTC: cubecl-cuda's `cpp` feature)",
        )
    }
}
