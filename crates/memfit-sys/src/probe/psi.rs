//! Pressure stall information (/proc/pressure/memory, or a cgroup v2 group's memory.pressure).

/// One line of a PSI file: the share of wall time some (or all) tasks stalled on memory.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PsiLine {
    /// Percent over the last 10 s, 60 s and 300 s.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time in microseconds since boot.
    pub total_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Psi {
    pub some: PsiLine,
    /// Absent on kernels that only report `some` for this resource.
    pub full: Option<PsiLine>,
}

/// Parses the text of a PSI file; `None` when the `some` line is missing or malformed.
pub fn parse_psi(text: &str) -> Option<Psi> {
    let line = |kind: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(kind)?.strip_prefix(' ').map(parse_line))
            .flatten()
    };
    Some(Psi {
        some: line("some")?,
        full: line("full"),
    })
}

fn parse_line(rest: &str) -> Option<PsiLine> {
    let field = |name: &str| {
        rest.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    Some(PsiLine {
        avg10: field("avg10")?.parse().ok()?,
        avg60: field("avg60")?.parse().ok()?,
        avg300: field("avg300")?.parse().ok()?,
        total_us: field("total")?.parse().ok()?,
    })
}

/// System-wide memory pressure; `None` when the kernel has no PSI (CONFIG_PSI off, or `psi=0`).
pub fn memory_pressure() -> Option<Psi> {
    parse_psi(&std::fs::read_to_string("/proc/pressure/memory").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_and_written() {
        let captured = include_str!("../../tests/fixtures/proc/pressure_memory");
        let psi = parse_psi(captured).unwrap();
        assert_eq!(psi.some.avg10, 0.0);
        assert!(psi.full.is_some());
        let text = include_str!(
            "../../tests/fixtures/cgroup-v2/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.pressure"
        );
        let psi = parse_psi(text).unwrap();
        assert_eq!(psi.some.avg10, 1.5);
        assert_eq!(psi.some.total_us, 123_456);
        assert_eq!(psi.full.unwrap().avg60, 0.1);
        assert!(parse_psi("some avg10=x").is_none());
        assert!(parse_psi("").is_none());
    }
}
