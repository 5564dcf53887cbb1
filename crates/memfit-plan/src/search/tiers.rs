//! The tier table: the planner's choice for each (host RAM, GPU memory) pair, the table the seed
//! guides wrote by hand.

use super::{Budget, Candidate, Request, plan};
use crate::arch::Arch;
use crate::memory::{Framework, Precision, Setup};
use serde::Serialize;

/// Host RAM rows, GiB.
pub const HOST_GIB: [u64; 5] = [8, 12, 16, 32, 64];
/// GPU columns, GiB; `None` = no GPU (train on the CPU).
pub const GPU_GIB: [Option<u64>; 8] = [
    None,
    Some(4),
    Some(8),
    Some(12),
    Some(16),
    Some(24),
    Some(48),
    Some(80),
];

#[derive(Debug, Clone, Serialize)]
pub struct TierTable {
    pub host_gib: Vec<u64>,
    pub gpu_gib: Vec<Option<u64>>,
    /// `cells[row][col]`: the chosen setup, `None` when nothing fits.
    pub cells: Vec<Vec<Option<Candidate>>>,
}

/// Plans every cell with the same request, only the budget changing.
pub fn tier_table(
    arch: &Arch,
    base: &Setup,
    target_batch: u64,
    headroom: f64,
    fw: &Framework,
) -> Result<TierTable, String> {
    let mut cells = Vec::new();
    for host in HOST_GIB {
        let mut row = Vec::new();
        for gpu in GPU_GIB {
            let req = Request {
                base: base.clone(),
                target_batch,
                budget: Budget {
                    gpu_bytes: gpu.map(|g| g << 30),
                    host_bytes: host << 30,
                    headroom,
                },
            };
            row.push(plan(arch, &req, fw)?.chosen);
        }
        cells.push(row);
    }
    Ok(TierTable {
        host_gib: HOST_GIB.to_vec(),
        gpu_gib: GPU_GIB.to_vec(),
        cells,
    })
}

/// A short cell: "8×4 bf16 ckpt z3+off".
pub fn cell_text(c: Option<&Candidate>) -> String {
    let Some(c) = c else { return "—".to_string() };
    let s = &c.setup;
    let p = match s.precision {
        Precision::Fp32 => "fp32",
        Precision::AmpBf16 => "amp-bf16",
        Precision::AmpFp16 => "amp-fp16",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    };
    let mut t = format!("{}×{} {p}", s.batch, s.accum);
    if s.grad_ckpt {
        t += " ckpt";
    }
    if s.zero.stage() > 0 {
        t += &format!(" z{}", s.zero.stage());
        if s.offload_params {
            t += "+off-all";
        } else if s.offload_optimizer {
            t += "+off-opt";
        }
    }
    t
}

impl TierTable {
    /// Header labels of the GPU columns.
    pub fn column_labels(&self) -> Vec<String> {
        self.gpu_gib
            .iter()
            .map(|g| g.map_or("CPU only".to_string(), |g| format!("GPU {g} GiB")))
            .collect()
    }

    /// Markdown (what the README holds).
    pub fn markdown(&self) -> String {
        let mut s = String::from("| host RAM |");
        for l in self.column_labels() {
            s += &format!(" {l} |");
        }
        s += "\n| --- |";
        s += &" --- |".repeat(self.gpu_gib.len());
        s += "\n";
        for (host, row) in self.host_gib.iter().zip(&self.cells) {
            s += &format!("| {host} GiB |");
            for c in row {
                s += &format!(" {} |", cell_text(c.as_ref()));
            }
            s += "\n";
        }
        s
    }
}
