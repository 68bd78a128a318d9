//! `cargo run --release -p nephele-sim --example replay -- [DATA] [COMPRESSION] [STRIDE] [OUT]`:
//! the replay without the CLI crate (which is slow to build), for quick experiments.

use std::path::PathBuf;

use nephele_sim::replay::{run_replay, ReplayOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let data = PathBuf::from(args.first().map_or("../shared/data", String::as_str));
    let mut options = ReplayOptions::default();
    if let Some(c) = args.get(1) {
        options.time_compression = c.parse()?;
    }
    if let Some(s) = args.get(2) {
        options.node_stride = s.parse()?;
    }
    let report = run_replay(&data, &options, &mut |line| eprintln!("{line}"))?;
    print!("{}", report.table());
    if let Some(out) = args.get(3) {
        report.write(&PathBuf::from(out))?;
    }
    Ok(())
}
