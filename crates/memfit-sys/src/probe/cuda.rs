//! What training on a CUDA GPU needs at run time, checked before anything touches a device
//! (docs/architecture.md §7): the driver's `libcuda.so.1` and its devices, and NVRTC (`libnvrtc.so.13`,
//! which compiles burn's kernels) with the CUDA headers it includes. cudarc panics at the first
//! device call when a library is missing; these checks say what is missing and where they looked.
//!
//! NVRTC is found under `CUDA_PATH`, `/usr/local/cuda`, `/opt/cuda`, or a Python install's
//! `nvidia/cu13` wheels (what `pip install torch` brings). [`prepare_nvrtc`] loads it from there
//! by its full path, so that cudarc's load by bare name finds it already in the process, and points
//! `CUDA_PATH` (where cubecl reads the headers from) at its root.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

/// The NVRTC major version cudarc's bindings are pinned to (`CUDARC_CUDA_VERSION`, .cargo/config.toml).
pub const NVRTC_MAJOR: u32 = 13;

/// The driver and the devices it shows this process (`CUDA_VISIBLE_DEVICES` applied).
#[derive(Debug, Clone, PartialEq)]
pub struct CudaDriver {
    /// `cuDriverGetVersion`: 13000 is CUDA 13.0.
    pub version: i32,
    /// Device names by CUDA index.
    pub devices: Vec<String>,
}

impl CudaDriver {
    /// `13.0` for 13000.
    pub fn version_text(&self) -> String {
        format!("{}.{}", self.version / 1000, (self.version % 1000) / 10)
    }
}

/// Where NVRTC and the CUDA headers were found.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvrtc {
    /// The CUDA root (`include/` holds the headers).
    pub root: PathBuf,
    /// `libnvrtc.so.13` itself.
    pub library: PathBuf,
}

/// Opens `libcuda.so.1` and lists the devices; the reason when there is no usable driver.
pub fn driver() -> Result<CudaDriver, String> {
    let lib = Library::open("libcuda.so.1").map_err(|e| {
        format!("no NVIDIA driver: libcuda.so.1 could not be loaded ({e}; looked in LD_LIBRARY_PATH and the ld cache)")
    })?;
    type Init = unsafe extern "C" fn(u32) -> c_int;
    type Count = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Version = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Get = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    // SAFETY: the symbols are the CUDA driver API's, with these C signatures (cuda.h).
    let (init, count, version, get, name) = unsafe {
        (
            lib.symbol::<Init>("cuInit")?,
            lib.symbol::<Count>("cuDeviceGetCount")?,
            lib.symbol::<Version>("cuDriverGetVersion")?,
            lib.symbol::<Get>("cuDeviceGet")?,
            lib.symbol::<Name>("cuDeviceGetName")?,
        )
    };
    let call = |what: &str, code: c_int| match code {
        0 => Ok(()),
        code => Err(format!(
            "the NVIDIA driver failed {what} (CUDA error {code})"
        )),
    };
    let (mut n, mut v) = (0, 0);
    // SAFETY: plain out-parameters; cuInit(0) may be called more than once.
    unsafe {
        call("cuInit", init(0))?;
        call("cuDriverGetVersion", version(&mut v))?;
        call("cuDeviceGetCount", count(&mut n))?;
    }
    let devices = (0..n)
        .map(|i| {
            let (mut buf, mut device) = ([0 as c_char; 256], 0);
            // SAFETY: out-parameters, and the buffer's length is passed.
            let code = unsafe {
                match get(&mut device, i) {
                    0 => name(buf.as_mut_ptr(), buf.len() as c_int, device),
                    code => code,
                }
            };
            match code {
                // SAFETY: the driver wrote a NUL-terminated name into the buffer.
                0 => unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned(),
                _ => format!("CUDA device {i}"),
            }
        })
        .collect();
    // the library stays loaded for the process's life (cudarc opens it again by name)
    std::mem::forget(lib);
    Ok(CudaDriver {
        version: v,
        devices,
    })
}

/// The CUDA roots searched for NVRTC and headers, in order.
pub fn nvrtc_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::env::var_os("CUDA_PATH")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    roots.extend(["/usr/local/cuda", "/opt/cuda"].map(PathBuf::from));
    roots.extend(
        python_site_packages()
            .into_iter()
            .map(|p| p.join("nvidia/cu13")),
    );
    roots
}

/// Finds NVRTC and the headers under the first root that has both; the places looked otherwise.
pub fn find_nvrtc() -> Result<Nvrtc, String> {
    let roots = nvrtc_roots();
    for root in &roots {
        if let Some(found) = nvrtc_under(root) {
            return Ok(found);
        }
    }
    let looked: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(format!(
        "NVRTC {NVRTC_MAJOR} (libnvrtc.so.{NVRTC_MAJOR} with the CUDA headers, include/cuda_fp16.h) \
         was not found; looked under: {}. Install the CUDA {NVRTC_MAJOR} toolkit, or `pip install \
         torch` (its nvidia/cu13 wheels), or set CUDA_PATH to a CUDA root",
        looked.join(", ")
    ))
}

/// NVRTC and the headers under one CUDA root, if both are there.
pub fn nvrtc_under(root: &Path) -> Option<Nvrtc> {
    if !root.join("include/cuda_fp16.h").is_file() {
        return None;
    }
    let name = format!("libnvrtc.so.{NVRTC_MAJOR}");
    ["lib64", "lib", "lib/x86_64-linux-gnu"]
        .iter()
        .map(|dir| root.join(dir).join(&name))
        .find(|p| p.is_file())
        .map(|library| Nvrtc {
            root: root.to_path_buf(),
            library,
        })
}

/// Loads NVRTC (and its builtins, beside it) by full path into the process, globally, so that
/// cudarc's later load by bare name gets it; sets `CUDA_PATH` to its root where unset.
///
/// Call before any thread reads the environment concurrently (the train command does it while
/// resolving its flags, before the run starts its threads).
pub fn prepare_nvrtc(found: &Nvrtc) -> Result<(), String> {
    let dir = found.library.parent().unwrap_or(Path::new("."));
    // NVRTC opens its builtins by name at its first compile; a pip wheel's are beside it.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("libnvrtc-builtins.so.{NVRTC_MAJOR}")) {
                Library::open_global(&entry.path())?.leak();
            }
        }
    }
    Library::open_global(&found.library)?.leak();
    if std::env::var_os("CUDA_PATH").is_none() {
        // SAFETY: called while no other thread reads or writes the environment (see above).
        unsafe { std::env::set_var("CUDA_PATH", &found.root) };
    }
    Ok(())
}

/// The names cudarc (burn's CUDA bindings) loads NCCL by (its candidate list, for CUDA 13):
/// `libnccl.so.2`, the name NCCL's own packages and the pip `nvidia-nccl` wheel give it, is not
/// among them.
const NCCL_NAMES: [&str; 7] = [
    "libnccl.so",
    "libnccl.so.13",
    "libnccl.so.12",
    "libnccl.so.11",
    "libnccl.so.10",
    "libnccl.so.9",
    "libnccl.so.1",
];

/// NCCL as data-parallel training on several GPUs loads it: the name it loads under, or what is
/// missing and how to fix it (a `libnccl.so.2` found where cudarc does not look is named). One
/// GPU needs no NCCL.
pub fn find_nccl() -> Result<String, String> {
    if let Some(name) = NCCL_NAMES.iter().find(|n| Library::open(n).is_ok()) {
        return Ok(name.to_string());
    }
    let mut roots = nvrtc_roots();
    roots.extend(
        python_site_packages()
            .into_iter()
            .map(|p| p.join("nvidia/nccl")),
    );
    roots.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    Err(match roots.iter().find_map(|r| nccl_under(r)) {
        Some(found) => format!(
            "several GPUs need NCCL: {} is there, but cudarc (burn's CUDA bindings) loads NCCL only \
             as libnccl.so or libnccl.so.<N> ({}): link it under that name and put the link's \
             directory on LD_LIBRARY_PATH: `mkdir -p ~/.local/lib/nccl && ln -sf {} \
             ~/.local/lib/nccl/libnccl.so && export LD_LIBRARY_PATH=~/.local/lib/nccl:$LD_LIBRARY_PATH`",
            found.display(),
            NCCL_NAMES.join(", "),
            found.display()
        ),
        None => format!(
            "several GPUs need NCCL, which was not found (loaded as {}; a libnccl.so.2 looked for \
             under {}): `pip install nvidia-nccl-cu13` or install NCCL; one GPU runs without it",
            NCCL_NAMES.join(", "),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// `libnccl.so.2` under `root` (`lib/`, `lib64/`, or `root` itself), if there.
pub fn nccl_under(root: &Path) -> Option<PathBuf> {
    ["lib", "lib64", "."]
        .iter()
        .map(|dir| root.join(dir).join("libnccl.so.2"))
        .find(|p| p.is_file())
}

/// The site-packages directories of `python3` on PATH (none when there is no Python).
fn python_site_packages() -> Vec<PathBuf> {
    // asked of Python once: NVRTC's and NCCL's searches (and `memfit check`, which runs both) share it
    static SITE: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    SITE.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
            ])
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect(),
            _ => Vec::new(),
        }
    })
    .clone()
}

/// A shared library opened with `dlopen`.
struct Library(*mut c_void);

impl Library {
    fn open(name: &str) -> Result<Self, String> {
        Self::open_with(name, libc::RTLD_NOW | libc::RTLD_LOCAL)
    }

    fn open_global(path: &Path) -> Result<Self, String> {
        Self::open_with(
            &path.display().to_string(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    }

    fn open_with(name: &str, flags: c_int) -> Result<Self, String> {
        let c = CString::new(name).map_err(|_| format!("{name}: a NUL in the name"))?;
        // SAFETY: a NUL-terminated path; dlopen runs the library's initialisers, which for the
        // NVIDIA libraries do no more than register themselves.
        let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
        if handle.is_null() {
            return Err(dl_error(name));
        }
        Ok(Self(handle))
    }

    /// # Safety
    /// `T` must be the C function pointer type of the symbol.
    unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T, String> {
        let c = CString::new(name).map_err(|_| format!("{name}: a NUL in the name"))?;
        // SAFETY: a valid handle and NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(format!(
                "the NVIDIA driver has no {name}: {}",
                dl_error(name)
            ));
        }
        // SAFETY: the caller names the symbol's type; a function pointer is pointer-sized.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    /// Keeps the library loaded for the process's life.
    fn leak(self) {
        std::mem::forget(self)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

fn dl_error(name: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message owned by the loader.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        format!("{name}: not found")
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_is_found_only_with_its_headers() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvrtc.so.13"), b"").unwrap();
        assert_eq!(nvrtc_under(root.path()), None, "no headers yet");
        std::fs::create_dir_all(root.path().join("include")).unwrap();
        std::fs::write(root.path().join("include/cuda_fp16.h"), b"").unwrap();
        let found = nvrtc_under(root.path()).unwrap();
        assert_eq!(found.library, lib.join("libnvrtc.so.13"));
        assert_eq!(found.root, root.path());
    }

    #[test]
    fn nccl_is_found_where_the_wheel_puts_it_and_its_absence_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(nccl_under(dir.path()), None);
        std::fs::create_dir_all(dir.path().join("lib")).unwrap();
        std::fs::write(dir.path().join("lib/libnccl.so.2"), b"").unwrap();
        assert_eq!(
            nccl_under(dir.path()),
            Some(dir.path().join("lib/libnccl.so.2"))
        );
        // here (CI) NCCL is not installed: the error says what multi-GPU needs and what to do
        if let Err(why) = find_nccl() {
            assert!(why.starts_with("several GPUs need NCCL"), "{why}");
            assert!(
                why.contains("libnccl.so") && why.contains("one GPU")
                    || why.contains("LD_LIBRARY_PATH"),
                "{why}"
            );
        }
    }

    #[test]
    fn a_library_that_is_not_there_is_an_error_not_a_panic() {
        let e = Library::open("libmemfit-no-such-library.so.1")
            .err()
            .unwrap();
        assert!(e.contains("libmemfit-no-such-library"), "{e}");
        let bad = Nvrtc {
            root: PathBuf::from("/nonexistent"),
            library: PathBuf::from("/nonexistent/lib/libnvrtc.so.13"),
        };
        assert!(prepare_nvrtc(&bad).unwrap_err().contains("libnvrtc.so.13"));
    }
}
