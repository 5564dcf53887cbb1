//! The CPU: model, cores, and the vector/matrix instruction sets a trainer's kernels can use.

use std::collections::BTreeSet;

/// Instruction-set flags that change CPU training speed, as /proc/cpuinfo names them
/// (arch/x86/include/asm/cpufeatures.h; `asimd`/`sve`/`sme` are the aarch64 counterparts).
const ISA_FLAGS: &[&str] = &[
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
    "sme",
];

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cpu {
    pub model: String,
    /// Logical CPUs the kernel lists.
    pub logical_cores: usize,
    /// Distinct (physical id, core id) pairs; equals `logical_cores` when cpuinfo does not say.
    pub physical_cores: usize,
    /// CPUs this process may run on (affinity mask; what thread pools should size themselves to).
    pub usable_cores: usize,
    /// The flags of `ISA_FLAGS` this CPU has.
    pub isa: Vec<String>,
    /// Clock of the first CPU as cpuinfo reports it (`cpu MHz`; the nominal clock in most VMs).
    pub mhz: Option<f64>,
}

impl Cpu {
    pub fn has(&self, flag: &str) -> bool {
        self.isa.iter().any(|f| f == flag)
    }
}

/// Parses /proc/cpuinfo text; `usable_cores` is filled by the caller (it is not in cpuinfo).
pub fn parse_cpuinfo(text: &str) -> Cpu {
    let mut model = String::new();
    let mut logical = 0;
    let mut cores = BTreeSet::new();
    let mut flags = BTreeSet::new();
    let (mut physical_id, mut core_id) = (None, None);
    let mut mhz = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => logical += 1,
            "model name" | "Model" if model.is_empty() => model = value.to_owned(),
            "physical id" => physical_id = Some(value.to_owned()),
            "core id" => core_id = Some(value.to_owned()),
            "cpu MHz" if mhz.is_none() => mhz = value.parse().ok(),
            "flags" | "Features" => flags.extend(value.split_whitespace().map(str::to_owned)),
            _ => {}
        }
        if let (Some(p), Some(c)) = (&physical_id, &core_id) {
            cores.insert((p.clone(), c.clone()));
            (physical_id, core_id) = (None, None);
        }
    }
    let isa = ISA_FLAGS
        .iter()
        .filter(|f| flags.contains(**f))
        .map(|f| (*f).to_owned())
        .collect();
    Cpu {
        model: if model.is_empty() {
            "unknown".into()
        } else {
            model
        },
        logical_cores: logical,
        physical_cores: if cores.is_empty() {
            logical
        } else {
            cores.len()
        },
        usable_cores: logical,
        isa,
        mhz,
    }
}

pub fn cpu() -> Option<Cpu> {
    let mut cpu = parse_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").ok()?);
    cpu.usable_cores = std::thread::available_parallelism().map_or(cpu.logical_cores, |n| n.get());
    Some(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_cpuinfo() {
        let cpu = parse_cpuinfo(include_str!("../../tests/fixtures/proc/cpuinfo"));
        assert_eq!(cpu.model, "Intel(R) Xeon(R) Processor @ 2.50GHz");
        assert_eq!(cpu.logical_cores, 2);
        assert!(cpu.has("avx2") && cpu.has("avx512f"));
        assert!(!cpu.has("sve"));
        assert_eq!(cpu.mhz, Some(2499.998));
    }

    #[test]
    fn amx_and_cores_from_synthetic_text() {
        let text = "processor\t: 0\nmodel name\t: Sapphire\nphysical id\t: 0\ncore id\t: 0\nflags\t: avx2 amx_tile amx_bf16\n\n\
                    processor\t: 1\nmodel name\t: Sapphire\nphysical id\t: 0\ncore id\t: 0\nflags\t: avx2 amx_tile amx_bf16\n";
        let cpu = parse_cpuinfo(text);
        assert_eq!((cpu.logical_cores, cpu.physical_cores), (2, 1));
        assert_eq!(cpu.isa, ["avx2", "amx_tile", "amx_bf16"]);
        assert_eq!(cpu.mhz, None, "no clock in this text");
    }
}
