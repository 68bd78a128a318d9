//! Times one ONNX model at batch 1 with the runtime's protocol (`bench::measure`), in
//! whatever profile this example is built with: how the README compares the `dist`
//! profile's size-oriented code with the release build's on the same models. It prints
//! the load (parse, analyse, optimise, plan) time too, which the parser's opt-level
//! decides.
//!
//! `cargo run --release -p nephele-runtime --no-default-features --example time_model -- MODEL.onnx [ROW_SHAPE] [--ops] [--rows FILE.json]`
//! (and the same with `--profile dist`); `ROW_SHAPE` fixes symbolic dimensions, e.g.
//! `3,48,320`. Rows are a fixed pseudo-random pattern (the time of most models does not
//! depend on it), or those of `--rows` (`{"rows": [[…], …]}`, as `ort_bench.py
//! --input-file` reads them): a model whose `If` depends on values runs the branch its
//! rows take.
//! `--ops` also prints where a run's time goes, per operator (`Model::op_profile`, 20
//! runs).

use std::time::Duration;

fn main() {
    let ops = std::env::args().any(|a| a == "--ops");
    let all: Vec<String> = std::env::args().skip(1).collect();
    let rows_file = all
        .iter()
        .position(|a| a == "--rows")
        .map(|i| all.get(i + 1).cloned().expect("--rows FILE.json"));
    let mut args = all
        .iter()
        .enumerate()
        .filter(|(i, a)| *a != "--ops" && *a != "--rows" && !(*i > 0 && all[i - 1] == "--rows"))
        .map(|(_, a)| a.clone());
    let Some(path) = args.next() else {
        eprintln!("usage: time_model MODEL.onnx [ROW_SHAPE, e.g. 3,48,320]");
        std::process::exit(2);
    };
    let row_shape: Option<Vec<usize>> = args.next().map(|text| {
        text.split(',')
            .map(|d| {
                d.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("bad dimension {d:?} in {text:?}"))
            })
            .collect()
    });
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let started = std::time::Instant::now();
    let model = nephele_runtime::Model::load_onnx_with_shape(&path, &bytes, row_shape.as_deref())
        .unwrap_or_else(|e| panic!("cannot load {path}: {e}"));
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let row_len: usize = model.input().shape[1..]
        .iter()
        .map(|d| (*d).max(1) as usize)
        .product();
    let rows: Vec<Vec<f32>> = match &rows_file {
        Some(file) => {
            let text =
                std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
            let json: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            let rows: Vec<Vec<f32>> = serde_json::from_value(json["rows"].clone())
                .unwrap_or_else(|e| panic!("{file}: \"rows\" is not a list of rows: {e}"));
            assert!(
                !rows.is_empty() && rows.iter().all(|r| r.len() == row_len),
                "{file}: every row must hold {row_len} values"
            );
            rows
        }
        None => (0..4)
            .map(|r| {
                (0..row_len)
                    .map(|i| ((i * 7 + r * 13) % 17) as f32 / 17.0)
                    .collect()
            })
            .collect(),
    };
    let stats = nephele_runtime::bench::measure(&model, &rows, 1, 20, Duration::from_secs(3), 30)
        .unwrap_or_else(|e| panic!("cannot run {path}: {e}"));
    println!(
        "{path}: loaded in {load_ms:.1} ms; batch 1, {} runs, p50 {:.4} ms, mean {:.4} ms, p99 {:.4} ms",
        stats.runs, stats.p50_ms, stats.mean_ms, stats.p99_ms
    );
    if ops {
        let profile = model
            .op_profile(20)
            .unwrap_or_else(|e| panic!("cannot profile {path}: {e}"));
        println!(
            "{:<48} {:>5} {:>10} {:>6}",
            "operator", "nodes", "us/run", "share"
        );
        for op in profile {
            println!(
                "{:<48} {:>5} {:>10.1} {:>5.1}%",
                op.op,
                op.nodes,
                op.us_per_run,
                op.share * 100.0
            );
        }
    }
}
