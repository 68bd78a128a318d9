//! Times the runtime's product kernel (`nephele_runtime::dense`) alone, on one thread:
//! median and fastest of 300 calls per shape, and the rate in GFLOP/s. Without
//! arguments, MiniLM's three product shapes at 128 tokens (the projections 384 → 384,
//! the feed-forward 384 → 1536 and 1536 → 384); otherwise the shapes given as
//! `ROWSxDEPTHxCOLUMNS` (rows of activations, shared dimension, output columns). How the
//! README's figures for the kernel by itself were measured (also under `perf record`,
//! and with `NARROW_DEPTH` rebuilt at other values to compare slices).
//!
//! `cargo run --release -p nephele-runtime --no-default-features --example dense_shapes [-- 128x768x3072 …]`

use std::time::Instant;

fn parse(shape: &str) -> Result<(usize, usize, usize), String> {
    let parts: Vec<usize> = shape
        .split('x')
        .map(|n| n.parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{shape}: expected ROWSxDEPTHxCOLUMNS, e.g. 128x768x3072"))?;
    match parts[..] {
        [rows, depth, columns] => Ok((rows, depth, columns)),
        _ => Err(format!("{shape}: expected three sizes, ROWSxDEPTHxCOLUMNS")),
    }
}

fn main() {
    let asked: Result<Vec<_>, String> = std::env::args().skip(1).map(|a| parse(&a)).collect();
    let shapes = match asked {
        Ok(shapes) if shapes.is_empty() => {
            vec![(128, 384, 384), (128, 384, 1536), (128, 1536, 384)]
        }
        Ok(shapes) => shapes,
        Err(e) => {
            eprintln!("dense_shapes: {e}");
            std::process::exit(2);
        }
    };
    for (rows, depth, columns) in shapes {
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
