//! memfit-memhog: a stand-in for a trainer whose memory grows, for the guard's tests.
//!
//! It allocates `--step-mib` every `--interval-ms`, writing every page so the memory is resident, up to
//! `--max-mib`, then holds it for `--hold-ms` and exits 0 (writing `--done FILE`). On SIGTERM, SIGINT or
//! SIGUSR1 it stops allocating, writes `--checkpoint FILE` (JSON with its peak RSS) atomically and exits 0,
//! as a trainer saves a checkpoint; with `--ignore-term` it ignores SIGTERM instead. `--resume FILE` makes
//! it refuse to start (exit 3) unless FILE exists, so tests can see that a resume argument arrived.
//! `--children N` starts N copies of itself (without `--children`), so the job is a tree.
//! `--shed-on-usr1` makes SIGUSR1 a request to shed memory instead: it frees half of what it holds, stops
//! growing and runs on to its normal end.
//! `--per-sample-mib M --batch N` adds N × M MiB to `--max-mib`: a trainer whose peak is a fixed part plus
//! a part per sample, for `memfit calibrate`'s tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Page size for touching memory; writing one byte per 4 KiB page makes the whole allocation resident.
const PAGE: usize = 4096;

struct Options {
    step_mib: usize,
    interval_ms: u64,
    max_mib: usize,
    per_sample_mib: usize,
    batch: usize,
    hold_ms: u64,
    checkpoint: Option<String>,
    done: Option<String>,
    resume: Option<String>,
    ignore_term: bool,
    shed_on_usr1: bool,
    children: usize,
    rest_for_children: Vec<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        step_mib: 8,
        interval_ms: 20,
        max_mib: 1024,
        per_sample_mib: 0,
        batch: 0,
        hold_ms: 0,
        checkpoint: None,
        done: None,
        resume: None,
        ignore_term: false,
        shed_on_usr1: false,
        children: 0,
        rest_for_children: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        let value = || {
            args.get(i + 1)
                .cloned()
                .ok_or(format!("{flag} needs a value"))
        };
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a number"))
        };
        let mut pass_on = true;
        match flag {
            "--step-mib" => o.step_mib = number(value()?)? as usize,
            "--interval-ms" => o.interval_ms = number(value()?)?,
            "--max-mib" => o.max_mib = number(value()?)? as usize,
            "--per-sample-mib" => o.per_sample_mib = number(value()?)? as usize,
            "--batch" => o.batch = number(value()?)? as usize,
            "--hold-ms" => o.hold_ms = number(value()?)?,
            "--checkpoint" => o.checkpoint = Some(value()?),
            "--done" => o.done = Some(value()?),
            "--resume" => o.resume = Some(value()?),
            "--children" => {
                o.children = number(value()?)? as usize;
                pass_on = false;
            }
            "--ignore-term" | "--shed-on-usr1" => {
                o.ignore_term |= flag == "--ignore-term";
                o.shed_on_usr1 |= flag == "--shed-on-usr1";
                o.rest_for_children.push(flag.into());
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
        if pass_on && !matches!(flag, "--checkpoint" | "--done") {
            o.rest_for_children
                .extend([flag.to_owned(), args[i + 1].clone()]);
        }
        i += 2;
    }
    Ok(o)
}

fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| memfit_sys::probe::meminfo_kib(&s, "VmHWM"))
        .map_or(0, |k| k * 1024)
}

fn write_atomic(path: &str, text: &str) {
    let tmp = format!("{path}.tmp{}", std::process::id());
    if std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .is_err()
    {
        eprintln!("memfit-memhog: cannot write {path}");
        std::process::exit(1);
    }
}

fn report(kind: &str, allocated: usize) -> String {
    format!(
        "{{\"kind\":\"{kind}\",\"pid\":{},\"allocated_bytes\":{},\"peak_rss_bytes\":{},\"tag\":{:?}}}\n",
        std::process::id(),
        allocated,
        peak_rss(),
        std::env::var("MEMHOG_TAG").unwrap_or_default()
    )
}

/// Flags the signals raise: (stop, shed). SIGUSR1 sheds half the memory under --shed-on-usr1,
/// SIGTERM is ignored under --ignore-term; the other signals stop. Exits when a handler cannot be
/// installed.
fn install_signal_flags(o: &Options) -> (Arc<AtomicBool>, Arc<AtomicBool>) {
    let stop = Arc::new(AtomicBool::new(false));
    let shed = Arc::new(AtomicBool::new(false));
    if o.shed_on_usr1
        && let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&shed))
    {
        eprintln!("memfit-memhog: cannot install a signal handler: {e}");
        std::process::exit(1);
    }
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGUSR1,
        signal_hook::consts::SIGTERM,
    ] {
        if sig == signal_hook::consts::SIGUSR1 && o.shed_on_usr1 {
            continue;
        }
        if sig == signal_hook::consts::SIGTERM && o.ignore_term {
            // SAFETY: installing SIG_IGN runs no code in the handler context.
            unsafe {
                let _ = nix::sys::signal::signal(
                    nix::sys::signal::Signal::SIGTERM,
                    nix::sys::signal::SigHandler::SigIgn,
                );
            }
            continue;
        }
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            eprintln!("memfit-memhog: cannot install a signal handler: {e}");
            std::process::exit(1);
        }
    }
    (stop, shed)
}

/// Starts --children copies of this program with the arguments meant for them.
fn spawn_children(o: &Options) -> Vec<std::process::Child> {
    let exe = std::env::current_exe().unwrap_or_else(|_| "memfit-memhog".into());
    (0..o.children)
        .filter_map(|_| {
            std::process::Command::new(&exe)
                .args(&o.rest_for_children)
                .spawn()
                .ok()
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("memfit-memhog: {e}");
            std::process::exit(2);
        }
    };
    if let Some(r) = &o.resume {
        if !std::path::Path::new(r).exists() {
            eprintln!("memfit-memhog: nothing to resume from: {r} is missing");
            std::process::exit(3);
        }
        eprintln!("memfit-memhog: resuming from {r}");
    }
    let (stop, shed) = install_signal_flags(&o);
    let mut kids = spawn_children(&o);

    let mut blocks: Vec<Vec<u8>> = Vec::new();
    let step = o.step_mib << 20;
    let mut allocated = 0usize;
    let mut hold_until: Option<Instant> = None;
    let mut max_bytes = (o.max_mib + o.per_sample_mib * o.batch) << 20;
    loop {
        if shed.swap(false, Ordering::SeqCst) {
            blocks.truncate(blocks.len() / 2);
            allocated = blocks.len() * step;
            max_bytes = allocated;
        }
        if stop.load(Ordering::SeqCst) {
            if let Some(path) = &o.checkpoint {
                write_atomic(path, &report("checkpoint", allocated));
            }
            for k in &mut kids {
                let _ = k.wait();
            }
            std::process::exit(0);
        }
        if allocated + step <= max_bytes {
            let mut block = vec![0u8; step];
            for page in block.chunks_mut(PAGE) {
                page[0] = 1;
            }
            blocks.push(block);
            allocated += step;
        } else {
            let until = *hold_until
                .get_or_insert_with(|| Instant::now() + Duration::from_millis(o.hold_ms));
            if Instant::now() >= until {
                break;
            }
        }
        // Sleep in 1 ms slices so a stop request is answered within about a millisecond.
        let wake = Instant::now() + Duration::from_millis(o.interval_ms);
        while Instant::now() < wake && !stop.load(Ordering::SeqCst) && !shed.load(Ordering::SeqCst)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for k in &mut kids {
        let _ = k.wait();
    }
    if let Some(path) = &o.done {
        write_atomic(path, &report("done", allocated));
    }
    std::hint::black_box(&blocks);
}
