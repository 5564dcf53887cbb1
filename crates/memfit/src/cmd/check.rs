//! `memfit check`: what this machine has, what is missing, and what to watch out for.

use std::path::PathBuf;
use std::process::ExitCode;

use comfy_table::Table;
use memfit_sys::probe::{self, Machine};
use memfit_sys::units::human_bytes as h;

use crate::exit::Outcome;

#[derive(clap::Args)]
pub struct Args {
    /// Where runs will be written (its free disk space is reported).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    let machine = probe::machine(&args.dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&machine)?);
    } else {
        print!("{}", render(&machine));
    }
    Ok(ExitCode::SUCCESS)
}

fn yes_no(flag: bool) -> &'static str {
    if flag { "yes" } else { "no" }
}

fn render(m: &Machine) -> String {
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    if let Some(c) = &m.cpu {
        t.add_row(vec![
            "CPU".to_owned(),
            format!(
                "{}: {} logical / {} physical cores, {} usable; AVX2 {}, AVX-512 {}, AMX {}",
                c.model,
                c.logical_cores,
                c.physical_cores,
                c.usable_cores,
                yes_no(c.has("avx2")),
                yes_no(c.has("avx512f")),
                yes_no(c.has("amx_tile")),
            ),
        ]);
    }
    if let Some(mem) = &m.memory {
        t.add_row(vec![
            "RAM".to_owned(),
            format!(
                "{} total, {} available",
                h(mem.total_bytes),
                h(mem.available_bytes)
            ),
        ]);
        t.add_row(vec![
            "Swap".to_owned(),
            if mem.swap_total_bytes == 0 {
                "none".to_owned()
            } else {
                format!(
                    "{} total, {} free",
                    h(mem.swap_total_bytes),
                    h(mem.swap_free_bytes)
                )
            },
        ]);
    }
    let cgroup = match &m.cgroup {
        None => "no memory cgroup found".to_owned(),
        Some(cg) => {
            let version = serde_json::to_value(cg.version).unwrap_or_default();
            let limit = match (cg.limit_bytes(), &cg.limited_by) {
                (Some(l), Some(dir)) => format!("limit {} set by {}", h(l), dir.display()),
                _ => "no limit".to_owned(),
            };
            format!(
                "{} {}: {limit}; {} in use; {} OOM kills",
                version.as_str().unwrap_or("?"),
                cg.dir.display(),
                cg.current_bytes.map_or("?".to_owned(), h),
                cg.events.oom_kill
            )
        }
    };
    t.add_row(vec!["cgroup".to_owned(), cgroup]);
    if let (Some(limit), Some(mem)) = (m.effective_limit_bytes, &m.memory) {
        t.add_row(vec![
            "Effective limit".to_owned(),
            format!(
                "{} ({} available to a new job now)",
                h(limit),
                h(mem.effective_available_bytes)
            ),
        ]);
    }
    if let Some(p) = &m.pressure {
        t.add_row(vec![
            "Memory pressure".to_owned(),
            format!(
                "some {:.2}% / full {:.2}% of the last 10 s",
                p.some.avg10,
                p.full.map_or(0.0, |f| f.avg10)
            ),
        ]);
    }
    if let Some(d) = &m.disk {
        t.add_row(vec![
            "Disk".to_owned(),
            format!(
                "{} free of {} at {}",
                h(d.free_bytes),
                h(d.total_bytes),
                d.path
            ),
        ]);
    }
    if let Some(s) = &m.shm {
        t.add_row(vec![
            "/dev/shm".to_owned(),
            format!("{} ({} free)", h(s.total_bytes), h(s.free_bytes)),
        ]);
    }
    let gpus = if m.gpus.is_empty() {
        "none".to_owned()
    } else {
        m.gpus
            .iter()
            .map(|g| {
                format!(
                    "{}: {} free of {}",
                    g.name,
                    h(g.free_bytes),
                    h(g.total_bytes)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
            + &m.gpu_driver
                .as_ref()
                .map(|d| format!("\ndriver {d}"))
                .unwrap_or_default()
    };
    t.add_row(vec!["GPUs".to_owned(), gpus]);
    let daemons = if m.oom_daemons.is_empty() {
        "none running".to_owned()
    } else {
        m.oom_daemons
            .iter()
            .map(|d| format!("{} (pid {})", d.name, d.pid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    t.add_row(vec!["OOM daemons".to_owned(), daemons]);
    let mut out = format!("{t}\n");
    for (title, items) in [("Not available", &m.missing), ("Warnings", &m.warnings)] {
        if !items.is_empty() {
            out.push_str(&format!("\n{title}:\n"));
            for item in items {
                out.push_str(&format!("  - {item}\n"));
            }
        }
    }
    out
}
