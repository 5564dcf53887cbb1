//! What `SHA256SUMS` costs a checkpoint: a directory holding one file of SIZE MiB (default 1024),
//! written and fsynced as a checkpoint is, then hashed (`checksums::write`) and checked
//! (`checksums::verify`), each timed. `cargo run --release -p memfit-train --example
//! checksum_cost -- [MiB] [DIR]` (DIR: where to write, default the temporary directory).

use memfit_train::checkpoint::checksums;
use std::io::Write;
use std::time::Instant;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(1024, |a| a.parse().expect("MiB"));
    let base = args.next().map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base)?;
    let path = dir.path().join("model.safetensors");
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let t = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..mib {
        file.write_all(&chunk)?;
    }
    file.sync_all()?;
    let written = t.elapsed().as_secs_f64();
    let t = Instant::now();
    checksums::write(dir.path())?;
    let hashed = t.elapsed().as_secs_f64();
    let t = Instant::now();
    assert_eq!(checksums::verify(dir.path()), Ok(true));
    let verified = t.elapsed().as_secs_f64();
    println!(
        "{mib} MiB: write + fsync {written:.2} s, SHA256SUMS written {hashed:.2} s ({:.0} MiB/s), \
         verified {verified:.2} s",
        mib as f64 / hashed
    );
    Ok(())
}
