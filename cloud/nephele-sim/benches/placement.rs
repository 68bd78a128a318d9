//! `cargo bench -p nephele-sim --bench placement`: placements per second at 1k, 10k
//! and 50k nodes for single pods, fractional-GPU pods and 8-member gangs, with the
//! fragmentation-aware scorer (FGD) on, one thread. Prints a table and writes
//! `target/bench-results/placement.{json,csv}` (override with NEPHELE_BENCH_OUT).

use std::path::PathBuf;

use nephele_placement::Policy;
use nephele_sim::bench::placement;

fn main() -> std::io::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a
    // smoke-sized pass then, so the bench stays compiled and working without costing CI.
    let full = std::env::args().any(|a| a == "--bench");
    let (sizes, decisions): (&[usize], usize) = if full {
        (&[1_000, 10_000, 50_000], 2_000)
    } else {
        (&[1_000], 50)
    };
    let mut csv = String::from(
        "nodes,policy,kind,decisions,placed,placements_per_sec,pods_per_sec,mean_us,first_decision_us\n",
    );
    let mut all = Vec::new();
    println!(
        "{:>7} {:<20} {:>14} {:>12} {:>9} {:>12}",
        "NODES", "KIND", "DECISIONS/S", "PODS/S", "MEAN µs", "FIRST µs"
    );
    for &nodes in sizes {
        let report = placement(nodes, decisions, Policy::Fgd, 42);
        for r in &report.results {
            println!(
                "{:>7} {:<20} {:>14.0} {:>12.0} {:>9.2} {:>12.0}",
                nodes, r.kind, r.placements_per_sec, r.pods_per_sec, r.mean_us, r.first_decision_us
            );
            csv += &format!(
                "{nodes},{},{},{},{},{:.1},{:.1},{:.3},{:.1}\n",
                report.policy,
                r.kind,
                r.decisions,
                r.placed,
                r.placements_per_sec,
                r.pods_per_sec,
                r.mean_us,
                r.first_decision_us
            );
        }
        all.push(report);
    }
    if full {
        let out = std::env::var_os("NEPHELE_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results")
            });
        std::fs::create_dir_all(&out)?;
        std::fs::write(out.join("placement.csv"), csv)?;
        let json = serde_json::to_string_pretty(&all).map_err(std::io::Error::other)?;
        std::fs::write(out.join("placement.json"), json)?;
        println!("wrote {}/placement.{{csv,json}}", out.display());
    }
    Ok(())
}
