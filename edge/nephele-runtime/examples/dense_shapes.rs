//! Times the runtime's product kernel (`nephele_runtime::dense`) alone on MiniLM's three
//! product shapes at 128 tokens (the projections 384 → 384, the feed-forward 384 → 1536
//! and 1536 → 384), on one thread: median and fastest of 300 calls, and the rate in
//! GFLOP/s. How the README's figures for the kernel by itself were measured (also under
//! `perf record`, and with `NARROW_DEPTH` rebuilt at other values to compare slices).
//!
//! `cargo run --release -p nephele-runtime --no-default-features --example dense_shapes`

use std::time::Instant;

fn main() {
    for (rows, depth, columns) in [
        (128usize, 384usize, 384usize),
        (128, 384, 1536),
        (128, 1536, 384),
    ] {
        let x: Vec<f32> = (0..rows * depth)
            .map(|i| ((i * 7) % 17) as f32 / 17.0)
            .collect();
        let w: Vec<f32> = (0..depth * columns)
            .map(|i| ((i * 5) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let bias: Vec<f32> = (0..columns).map(|i| i as f32 / 100.0).collect();
        let laid = nephele_runtime::dense::panels(&w, depth, columns);
        let layer = nephele_runtime::dense::Layer {
            laid: &laid,
            bias: &bias,
            depth,
            columns,
        };
        let mut times: Vec<f64> = (0..300)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(nephele_runtime::dense::run(&x, &layer));
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        let gflops = 2.0 * (rows * depth * columns) as f64 / (p50 * 1e-3) / 1e9;
        println!(
            "{rows} x {depth} by {depth} x {columns}: p50 {p50:.3} ms, fastest {:.3} ms, {gflops:.1} GFLOP/s",
            times[0]
        );
    }
}
