//! `nephele sim autoscale` on the shared traces (`../shared/data`, not part of the
//! repository; under CI its absence fails): the decisions the simulator acted on
//! depend on nothing but the signals the serving core gave the scaler (so a region
//! given the same signals decides the same), a region restart mid-trace resumes the
//! same decisions, ours runs one configuration with a learned capacity, and the
//! held-out variations run. Prints what it measured; the figures are the benchmark's
//! (`nephele sim autoscale --heldout`), not asserted here.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use nephele_autoscale::{Decision, Ours, OursConfig, ScalingPolicy, Signals};
use nephele_sim::autoscale::{
    ours_config, run_autoscale_workload, simulate, AutoscaleOptions, RunContext,
};
use nephele_sim::autoscale_trace::{load_cold_starts, load_workload};
use nephele_sim::autoscale_variants::variations;
use nephele_sim::trace::load_prices;

fn data() -> Option<PathBuf> {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if data.join("azure-llm-inference-2023").is_dir() {
        return Some(data);
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIP: {} has no azure-llm-inference-2023/",
        data.display()
    );
    // CI always has the traces beside the checkout: there, their absence fails.
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
        "{} not found, and CI always has ../shared/data",
        data.display()
    );
    None
}

/// Ticks `Ours` and writes down every (time, signals, decision).
struct Recorder {
    ours: Ours,
    ticks: Vec<(u64, Signals, Decision)>,
}

impl ScalingPolicy for Recorder {
    fn name(&self) -> &'static str {
        "ours"
    }
    fn period_ms(&self) -> u64 {
        self.ours.period_ms()
    }
    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        let decision = self.ours.tick(now_ms, signals);
        self.ticks.push((now_ms, signals.clone(), decision.clone()));
        decision
    }
}

fn run_recorded(data: &Path, trace: &str) -> (Recorder, OursConfig) {
    let options = AutoscaleOptions::default();
    let workload = load_workload(data, trace, &options.service).expect("trace loads");
    let cold_starts = load_cold_starts(data).expect("cold starts load");
    let prices = load_prices(data, &options.zone).expect("prices load");
    let span = workload.requests.last().map_or(0, |r| r.arrival_us);
    let config = ours_config(&workload, &options, span / 2);
    let mut recorder = Recorder {
        ours: Ours::new(config.clone()).expect("the default configuration is valid"),
        ticks: Vec::new(),
    };
    let context = RunContext {
        workload: &workload,
        cold_starts: &cold_starts,
        prices: &prices,
        seed: 42,
        bucket_us: 60_000_000,
        tune_until_us: span / 2,
        initial_replicas: 1,
        cold_start_scale: 1.0,
        declared_concurrency: workload.llm.is_some().then_some(1),
        score_from_us: 0,
    };
    let result = simulate("ours", &mut recorder, &context);
    let _ = writeln!(
        std::io::stderr(),
        "{trace}: ours {:.2}% within at {:.1} GPU-hours over {} ticks; capacity {:?} req/s per replica (learned: {})",
        result.within_slo * 100.0,
        result.gpu_hours,
        recorder.ticks.len(),
        recorder.ours.capacity().current(),
        recorder.ours.capacity().is_learned()
    );
    (recorder, config)
}

#[test]
fn the_simulators_decisions_are_what_a_region_decides_on_the_same_signals() {
    let Some(data) = data() else { return };
    for trace in ["azure-code", "genai-lora"] {
        let (recorder, config) = run_recorded(&data, trace);
        assert!(
            recorder.ticks.len() > 100,
            "{trace}: {} ticks",
            recorder.ticks.len()
        );
        // A region's scaler, given the signals the simulator's serving core produced,
        // decides what the simulator carried out, tick for tick; and one restarted
        // from its persisted state at the middle of the trace too.
        let mut region = Ours::new(config.clone()).expect("valid");
        let cut = recorder.ticks.len() / 2;
        for (index, (now_ms, signals, decision)) in recorder.ticks.iter().enumerate() {
            if index == cut {
                let saved = serde_json::to_string(&region).expect("serialises");
                region = serde_json::from_str(&saved).expect("resumes");
            }
            let again = region.tick(*now_ms, signals);
            assert_eq!(
                again.desired, decision.desired,
                "{trace} tick {index} at {now_ms} ms"
            );
            assert_eq!(again.mode, decision.mode, "{trace} tick {index}");
            assert_eq!(again.reason, decision.reason, "{trace} tick {index}");
        }
        // The scaler was told answers, within-target counts and a learned capacity.
        assert!(recorder.ticks.iter().any(|(_, s, _)| s.answered > 0));
        assert!(recorder.ours.capacity().current().is_some());
    }
}

#[test]
fn one_configuration_runs_every_held_out_variation_of_a_trace() {
    let Some(data) = data() else { return };
    let options = AutoscaleOptions {
        oracle: false,
        ..AutoscaleOptions::default()
    };
    let workload = load_workload(&data, "azure-code", &options.service).expect("loads");
    let cold_starts = load_cold_starts(&data).expect("cold starts");
    let prices = load_prices(&data, &options.zone).expect("prices");
    let variants = variations(&workload, 7);
    assert_eq!(variants.len(), 11);
    for variant in variants {
        let report = run_autoscale_workload(
            variant.workload,
            &cold_starts,
            &prices,
            &options,
            &mut |_| {},
        )
        .expect("runs");
        let names: Vec<&str> = report.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["static", "hpa", "kpa", "ours"], "{}", variant.name);
        // No per-trace patch: ours runs the defaults, with this run's bounds and target.
        let defaults = OursConfig::default();
        assert_eq!(
            report.ours_config.capacity, defaults.capacity,
            "{}",
            variant.name
        );
        assert_eq!(report.ours_config.min_replicas, 1);
        let ours = &report.policies[3];
        let static_ = &report.policies[0];
        let _ = writeln!(
            std::io::stderr(),
            "{:<24} ours {:.2}% at {:.0}% of static ({} replicas); capacity {:?}",
            variant.name,
            ours.within_slo * 100.0,
            100.0 * ours.gpu_hours / static_.gpu_hours.max(1e-9),
            report.static_replicas,
            report.ours_capacity.as_ref().map(|c| c.per_replica_per_s)
        );
        assert!(
            ours.requests > 0 && ours.gpu_hours > 0.0,
            "{}",
            variant.name
        );
        assert!(report.warmup_s > 0.0);
    }
}
