//! Pod lists the placement policies were never chosen on, made from a list's own pods:
//! the share of multi-GPU pods, the share of fractional (shared-GPU) pods, or the CPU
//! each GPU pod asks for, changed while every pod still comes from the list
//! (`nephele sim inflation --pods default@multi30`). The FGD study's own lists vary
//! sharing, GPU-type constraints and CPU-only load; the held-out lists that ours lost
//! on were ones where multi-GPU pods are common, which none of the 13 is (under 1%).
//!
//! Pure: the same list, spec and seed give the same pods.

use nephele_placement::rng::Rng;
use nephele_placement::{PodRequest, MILLI_PER_GPU};

use crate::trace::{PodMeta, Trace};

/// How a list is resampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resample {
    /// This share of the GPU pods asks for several GPUs (drawn from the list's
    /// multi-GPU pods), the rest from its one-GPU and shared pods.
    MultiGpu(f64),
    /// This share of the GPU pods asks for part of one GPU (drawn from the list's
    /// shared pods), the rest from its whole-GPU pods.
    Shared(f64),
    /// Every GPU pod asks for this many times its CPU (capped at the largest node's).
    CpuHeavy(f64),
}

/// The resampled lists `--pods resampled` runs: four shares of multi-GPU pods (as the
/// FGD authors' multi-GPU lists vary it), fewer and more shared pods, and two
/// CPU-heavier mixes, all made from the default list.
pub const STANDARD: [&str; 8] = [
    "default@multi20",
    "default@multi30",
    "default@multi40",
    "default@multi50",
    "default@shared20",
    "default@shared70",
    "default@cpu1.5x",
    "default@cpu2x",
];

impl Resample {
    /// `multi30` (30% of GPU pods multi-GPU), `shared70`, `cpu2x`.
    pub fn parse(spec: &str) -> Result<Resample, String> {
        let share = |digits: &str| -> Result<f64, String> {
            match digits.parse::<u32>() {
                Ok(pct) if pct <= 100 => Ok(f64::from(pct) / 100.0),
                _ => Err(format!(
                    "{spec:?}: the share is a whole percentage, 0 to 100"
                )),
            }
        };
        if let Some(digits) = spec.strip_prefix("multi") {
            return share(digits).map(Resample::MultiGpu);
        }
        if let Some(digits) = spec.strip_prefix("shared") {
            return share(digits).map(Resample::Shared);
        }
        if let Some(factor) = spec.strip_prefix("cpu").and_then(|f| f.strip_suffix('x')) {
            return match factor.parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 && f <= 16.0 => Ok(Resample::CpuHeavy(f)),
                _ => Err(format!(
                    "{spec:?}: the factor is a number above 0, at most 16"
                )),
            };
        }
        Err(format!(
            "unknown resampling {spec:?} (multiNN, sharedNN or cpuFx, e.g. multi30, shared70, cpu2x)"
        ))
    }
}

/// `trace` with its pods resampled as `how` says; the nodes stay. The seed is the
/// caller's (the command line derives it from the spec, so a name means one list).
pub fn resample(trace: &Trace, how: Resample, seed: u64) -> Result<Trace, String> {
    let meta = |i: usize| {
        trace.meta.get(i).cloned().unwrap_or_else(|| PodMeta {
            name: format!("pod-{i}"),
            qos: String::new(),
            phase: String::new(),
            creation: 0,
            deletion: 0,
            scheduled: 0,
        })
    };
    let gpu: Vec<usize> = (0..trace.pods.len())
        .filter(|i| trace.pods[*i].num_gpu > 0)
        .collect();
    let (chosen, rest): (Vec<usize>, Vec<usize>) = match how {
        Resample::MultiGpu(_) => gpu.iter().partition(|i| trace.pods[**i].num_gpu > 1),
        Resample::Shared(_) => gpu.iter().partition(|i| {
            let pod = &trace.pods[**i];
            pod.num_gpu == 1 && pod.gpu_milli < MILLI_PER_GPU
        }),
        Resample::CpuHeavy(_) => (Vec::new(), Vec::new()),
    };
    let share = match how {
        Resample::MultiGpu(share) | Resample::Shared(share) => share,
        Resample::CpuHeavy(_) => 0.0,
    };
    let what = match how {
        Resample::MultiGpu(_) => "multi-GPU",
        Resample::Shared(_) => "shared-GPU",
        Resample::CpuHeavy(_) => "",
    };
    if share > 0.0 && chosen.is_empty() {
        return Err(format!("the list has no {what} pods to draw from"));
    }
    if share < 1.0 && rest.is_empty() && !matches!(how, Resample::CpuHeavy(_)) {
        return Err(format!("the list has only {what} pods among its GPU pods"));
    }
    let max_cpu = trace.nodes.iter().map(|n| n.cpu_milli).max().unwrap_or(0);
    let mut rng = Rng::new(seed);
    let mut pods: Vec<PodRequest> = Vec::with_capacity(trace.pods.len());
    let mut metas = Vec::with_capacity(trace.pods.len());
    for (i, pod) in trace.pods.iter().enumerate() {
        let source = match how {
            _ if pod.num_gpu == 0 => i,
            Resample::CpuHeavy(_) => i,
            Resample::MultiGpu(_) | Resample::Shared(_) => {
                let pool = if (rng.below(1 << 30) as f64) < share * f64::from(1u32 << 30) {
                    &chosen
                } else {
                    &rest
                };
                pool[rng.below(pool.len() as u64) as usize]
            }
        };
        let mut drawn = trace.pods[source].clone();
        if let Resample::CpuHeavy(factor) = how {
            if drawn.num_gpu > 0 {
                drawn.cpu_milli = ((drawn.cpu_milli as f64 * factor).round() as u64).min(max_cpu);
            }
        }
        let mut m = meta(source);
        m.name = format!("{}-r{i}", m.name);
        pods.push(drawn);
        metas.push(m);
    }
    Ok(Trace {
        nodes: trace.nodes.clone(),
        pods,
        meta: metas,
        models: trace.models.clone(),
    })
}

/// A stable seed for a spec (so `default@multi30` is one list wherever it is named).
pub fn seed_of(spec: &str) -> u64 {
    spec.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_placement::NodeSpec;
    use proptest::prelude::*;

    fn trace(pods: Vec<PodRequest>) -> Trace {
        Trace {
            nodes: vec![NodeSpec {
                name: "n".into(),
                cpu_milli: 96_000,
                memory_mib: 1 << 20,
                gpus: 8,
                ..NodeSpec::default()
            }],
            meta: Vec::new(),
            models: Vec::new(),
            pods,
        }
    }

    fn pod(cpu: u64, gpus: u8, milli: u32) -> PodRequest {
        PodRequest {
            cpu_milli: cpu,
            memory_mib: 1024,
            num_gpu: gpus,
            gpu_milli: milli,
            ..PodRequest::default()
        }
    }

    fn mixed() -> Trace {
        let mut pods = Vec::new();
        for i in 0..200u64 {
            pods.push(match i % 10 {
                0 => pod(4000, 0, 0),
                1 => pod(32_000, 8, 1000),
                2 => pod(8000, 2, 1000),
                3..=5 => pod(6000, 1, 500),
                _ => pod(12_000, 1, 1000),
            });
        }
        trace(pods)
    }

    #[test]
    fn specs_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(Resample::parse("multi30"), Ok(Resample::MultiGpu(0.3)));
        assert_eq!(Resample::parse("shared70"), Ok(Resample::Shared(0.7)));
        assert_eq!(Resample::parse("cpu1.5x"), Ok(Resample::CpuHeavy(1.5)));
        for bad in ["multi", "multi130", "cpu0x", "cpu2", "heavy"] {
            let error = Resample::parse(bad).unwrap_err();
            assert!(error.contains(bad), "{bad}: {error}");
        }
        for spec in STANDARD {
            let (_, how) = spec.split_once('@').expect("list@spec");
            assert!(Resample::parse(how).is_ok(), "{spec}");
        }
    }

    #[test]
    fn a_list_without_the_pods_asked_for_is_refused() {
        let singles = trace(vec![pod(1000, 1, 1000); 10]);
        let error = resample(&singles, Resample::MultiGpu(0.3), 1).unwrap_err();
        assert!(error.contains("no multi-GPU pods"), "{error}");
        assert!(resample(&singles, Resample::MultiGpu(0.0), 1).is_ok());
    }

    proptest! {
        #[test]
        fn pods_come_from_the_list_and_the_share_is_near_the_one_asked(
            pct in 0u32..=100, seed in any::<u64>(), multi in any::<bool>()
        ) {
            let list = mixed();
            let share = f64::from(pct) / 100.0;
            let how = if multi { Resample::MultiGpu(share) } else { Resample::Shared(share) };
            let out = resample(&list, how, seed).expect("resamples");
            prop_assert_eq!(out.pods.len(), list.pods.len());
            prop_assert_eq!(out.meta.len(), out.pods.len());
            // CPU-only pods stay where they were; every pod is one of the list's.
            for (before, after) in list.pods.iter().zip(&out.pods) {
                prop_assert_eq!(before.num_gpu == 0, after.num_gpu == 0);
                prop_assert!(list.pods.contains(after));
            }
            let gpu: Vec<&PodRequest> = out.pods.iter().filter(|p| p.num_gpu > 0).collect();
            let hit = gpu
                .iter()
                .filter(|p| if multi { p.num_gpu > 1 } else { p.gpu_milli < MILLI_PER_GPU })
                .count() as f64
                / gpu.len() as f64;
            // 180 draws: within 5 standard deviations of the share asked for.
            let sd = (share * (1.0 - share) / gpu.len() as f64).sqrt();
            prop_assert!((hit - share).abs() <= 5.0 * sd + 1e-9, "{} vs {}", hit, share);
            prop_assert_eq!(resample(&list, how, seed).expect("again").pods, out.pods);
        }

        #[test]
        fn cpu_heavy_scales_gpu_pods_only_and_never_past_the_largest_node(
            factor in 0.1f64..16.0
        ) {
            let list = mixed();
            let out = resample(&list, Resample::CpuHeavy(factor), 3).expect("resamples");
            for (before, after) in list.pods.iter().zip(&out.pods) {
                if before.num_gpu == 0 {
                    prop_assert_eq!(before, after);
                } else {
                    let want = ((before.cpu_milli as f64 * factor).round() as u64).min(96_000);
                    prop_assert_eq!(after.cpu_milli, want);
                }
            }
        }
    }
}
