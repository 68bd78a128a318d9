//! Tests of the region's replay: FIFO serving, routing, cold starts, LLM replicas,
//! admission, and ours' configuration override.

use std::path::PathBuf;

use nephele_autoscale::config::OursConfig;
use nephele_autoscale::forecast::ForecasterKind;
use nephele_autoscale::{Hpa, HpaConfig, Ours, ScalingPolicy, Static};

use super::*;
use crate::autoscale_llm::LlmProfile;
use crate::autoscale_trace::gpu_price;
use crate::autoscale_trace::{Request, Workload};
use crate::trace::HourlySeries;

fn workload(requests: Vec<Request>, concurrency: u32) -> Workload {
    Workload {
        name: "test".into(),
        path: PathBuf::from("test.csv"),
        start_hour: 0,
        start_offset_s: 0.0,
        concurrency,
        gpu: gpu_price("A10G-24GB").expect("row"),
        gpus_per_replica: 1,
        llm: None,
        service_model: "fixed".into(),
        target_rule: "test".into(),
        target_floor_ms: 1_000.0,
        requests,
    }
}

fn prices() -> HourlySeries {
    HourlySeries {
        zone: "X".into(),
        start_hour: 0,
        values: vec![100.0; 24],
        filled: 0,
        duplicates: 0,
        estimated: 0,
    }
}

fn run(
    workload: &Workload,
    policy: &mut dyn ScalingPolicy,
    initial: u32,
    cold_ms: f64,
) -> PolicyResult {
    let prices = prices();
    let cold = [cold_ms];
    let context = RunContext {
        workload,
        cold_starts: &cold,
        prices: &prices,
        seed: 1,
        bucket_us: 15_000_000,
        tune_until_us: workload.requests.last().map_or(0, |r| r.arrival_us) / 2,
        initial_replicas: initial,
        cold_start_scale: 1.0,
        declared_concurrency: None,
        score_from_us: 0,
    };
    simulate("p", policy, &context)
}

fn request(arrival_s: f64, service_ms: f64, target_ms: f64) -> Request {
    Request::timed((arrival_s * 1e6) as u64, service_ms, target_ms)
}

#[test]
fn one_replica_serves_in_fifo_order_and_counts_its_gpu_time() {
    // Three 1 s requests at once on one single-slot replica: latencies 1, 2, 3 s;
    // a last request at 100 s ends the accounting: 100 s of one replica.
    let w = workload(
        vec![
            request(0.0, 1_000.0, 2_000.0),
            request(0.0, 1_000.0, 2_000.0),
            request(0.0, 1_000.0, 2_000.0),
            request(100.0, 1_000.0, 2_000.0),
        ],
        1,
    );
    let result = run(&w, &mut Static::new(1), 1, 0.0);
    assert_eq!(result.outside, 1, "the third waited 2 s");
    assert!((result.gpu_hours - 100.0 / 3600.0).abs() < 1e-9);
    assert_eq!(result.scale_events, 0);
    // Energy: idle 37.5 W for 100 s + (150 − 37.5) W for 3 busy seconds (the
    // last request is served after the last arrival, where accounting stops).
    let kwh = (37.5 * 100.0 + 112.5 * 3.0) / 3.6e6;
    assert!(
        (result.energy_kwh - kwh).abs() < 1e-9,
        "{}",
        result.energy_kwh
    );
    assert!((result.energy_cost - kwh * 0.1).abs() < 1e-9);
}

#[test]
fn least_outstanding_spreads_and_a_cold_start_delays_the_buffered() {
    let w = workload(
        (0..8)
            .map(|_| request(0.0, 1_000.0, 1_500.0))
            .chain([request(60.0, 1.0, 1.0)])
            .collect(),
        1,
    );
    // Eight replicas ready: every request served at once.
    assert_eq!(run(&w, &mut Static::new(8), 8, 0.0).outside, 0);
    // Two ready: 4 rounds of 1 s → the last six wait.
    assert_eq!(run(&w, &mut Static::new(2), 2, 0.0).outside, 6);
}

fn llm_workload(requests: Vec<Request>) -> Workload {
    Workload {
        gpus_per_replica: 2,
        llm: Some(LlmProfile::llama2_70b_h100_tp2()),
        gpu: gpu_price("H100-SXM-80GB").expect("row"),
        ..workload(requests, 1)
    }
}

fn llm_request(arrival_s: f64, prompt: u32, output: u32) -> Request {
    let alone = LlmProfile::llama2_70b_h100_tp2().isolated(prompt, output);
    Request {
        arrival_us: (arrival_s * 1e6) as u64,
        service_ms: alone.e2e_ms,
        target_ms: 5.0 * alone.e2e_ms,
        prompt_tokens: prompt,
        output_tokens: output,
        ttft_target_ms: 6.0 * alone.ttft_ms,
        tbt_target_ms: 5.0 * alone.tbt_ms,
    }
}

#[test]
fn an_llm_request_alone_takes_its_isolated_latency_on_two_gpus() {
    let w = llm_workload(vec![llm_request(0.0, 3000, 10), llm_request(100.0, 100, 6)]);
    let result = run(&w, &mut Static::new(1), 1, 0.0);
    assert_eq!(result.outside, 0);
    let alone = LlmProfile::llama2_70b_h100_tp2().isolated(3000, 10);
    assert!(
        (result.latency_p99_ms - alone.e2e_ms).abs() < 0.01,
        "{} against {}",
        result.latency_p99_ms,
        alone.e2e_ms
    );
    // One replica of two GPUs for the 100 s to the last arrival.
    assert!((result.gpu_hours - 2.0 * 100.0 / 3600.0).abs() < 1e-9);
}

#[test]
fn a_short_prompt_behind_a_long_one_misses_its_first_token_unless_routed_elsewhere() {
    let w = llm_workload(vec![
        llm_request(0.0, 7000, 10),
        llm_request(0.01, 100, 6),
        llm_request(100.0, 100, 6),
    ]);
    let one = run(&w, &mut Static::new(1), 1, 0.0);
    assert_eq!((one.outside, one.over_ttft), (1, 1));
    // Two replicas: token-JSQ sends the short prompt to the idle one.
    assert_eq!(run(&w, &mut Static::new(2), 2, 0.0).outside, 0);
}

#[test]
fn an_override_merges_nested_fields_and_is_validated() {
    let patch = serde_json::json!({"warm": {"max_warm": 3}, "min_replicas": 2});
    let merged = with_override(OursConfig::default(), Some(&patch)).expect("valid");
    assert_eq!(merged.warm.max_warm, 3);
    assert_eq!(merged.warm.quantile, OursConfig::default().warm.quantile);
    assert_eq!(merged.min_replicas, 2);
    let bad = serde_json::json!({"min_replicas": 100});
    assert!(with_override(OursConfig::default(), Some(&bad)).is_err());
}

#[test]
fn ours_sheds_what_would_miss_and_scales_out() {
    // 200 requests of 1 s in 10 s on one replica, 20 s cold starts.
    let mut requests: Vec<Request> = (0..200)
        .map(|i| request(i as f64 * 0.05, 1_000.0, 2_000.0))
        .collect();
    requests.push(request(300.0, 1_000.0, 2_000.0));
    let w = workload(requests, 1);
    let mut config = OursConfig::default();
    config.forecast.model = ForecasterKind::Last;
    let mut ours = Ours::new(config).expect("valid");
    let result = run(&w, &mut ours, 1, 20_000.0);
    assert!(result.shed > 50, "{}", result.shed);
    assert!(result.peak_replicas > 10, "{}", result.peak_replicas);
    let hpa_result = run(
        &w,
        &mut Hpa::new(HpaConfig::default()).expect("valid"),
        1,
        20_000.0,
    );
    assert_eq!(hpa_result.shed, 0);
    // Deterministic: the same run twice.
    let mut again = Ours::new({
        let mut c = OursConfig::default();
        c.forecast.model = ForecasterKind::Last;
        c
    })
    .expect("valid");
    let second = run(&w, &mut again, 1, 20_000.0);
    assert_eq!(
        (
            result.outside,
            result.shed,
            result.scale_events,
            result.gpu_hours.to_bits()
        ),
        (
            second.outside,
            second.shed,
            second.scale_events,
            second.gpu_hours.to_bits()
        )
    );
}
