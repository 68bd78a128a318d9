//! `cargo bench -p nephele-sim --bench placement`: placements per second at 1k, 10k
//! and 50k nodes for single pods, fractional-GPU pods, 8-member gangs and spread pods,
//! with FGD's scorer and with ours, one thread. Prints a table and writes
//! `target/bench-results/placement.{json,csv}` (override with NEPHELE_BENCH_OUT).

use std::path::PathBuf;

use nephele_placement::Policy;
use nephele_sim::bench::placement_rounds;

fn main() -> std::io::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a
    // smoke-sized pass then, so the bench stays compiled and working without costing CI.
    let full = std::env::args().any(|a| a == "--bench");
    let (sizes, decisions, rounds): (&[usize], usize, usize) = if full {
        (&[1_000, 10_000, 50_000], 2_000, 5)
    } else {
        (&[1_000], 50, 1)
    };
    let mut csv = String::from(
        "nodes,policy,kind,decisions,placed,rounds,placements_per_sec,placements_per_sec_min,placements_per_sec_max,pods_per_sec,mean_us,first_decision_us\n",
    );
    let mut all = Vec::new();
    println!(
        "{:>7} {:<6} {:<20} {:>14} {:>12} {:>9} {:>12}",
        "NODES", "POLICY", "KIND", "DECISIONS/S", "PODS/S", "MEAN µs", "FIRST µs"
    );
    for (&nodes, policy) in sizes
        .iter()
        .flat_map(|n| [(n, Policy::Fgd), (n, Policy::Ours)])
    {
        let report = placement_rounds(nodes, decisions, rounds, policy, 42);
        for r in &report.results {
            println!(
                "{:>7} {:<6} {:<20} {:>14.0} {:>12.0} {:>9.2} {:>12.0}",
                nodes,
                report.policy,
                r.kind,
                r.placements_per_sec,
                r.pods_per_sec,
                r.mean_us,
                r.first_decision_us
            );
            csv += &format!(
                "{nodes},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.3},{:.1}\n",
                report.policy,
                r.kind,
                r.decisions,
                r.placed,
                r.rounds,
                r.placements_per_sec,
                r.placements_per_sec_min,
                r.placements_per_sec_max,
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
