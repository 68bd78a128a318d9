//! Held-out variations of an autoscaling request trace, so that `nephele sim autoscale`
//! can report the default autoscaler configuration on data that chose no parameter:
//! the default was picked on the tune part of the real traces, and each variation
//! below changes when requests come or how large they are, seeded and reproducible.
//!
//! | name                         | how it is made                                                          |
//! |------------------------------|-------------------------------------------------------------------------|
//! | `first-half`                 | requests before half the span (the tune cut), re-origined               |
//! | `second-half`                | requests from half the span on, re-origined (wall clock kept)           |
//! | `rate-x0.25`, `rate-x0.5`    | Bernoulli thinning, arrival times unchanged                             |
//! | `rate-x2`, `rate-x4`         | the trace overlaid with 1 or 3 circularly shifted copies of itself      |
//! | `lengths-shuffled`           | arrivals kept, sizes permuted across requests                           |
//! | `lengths-swapped-halves`     | arrivals kept, each request takes a size drawn from the other half      |
//! | `lengths-x0.5`, `-x2`, `-x4` | output tokens (LLM) or service time (images) scaled, targets recomputed |
//!
//! A request's "size" is every field but its arrival: service time, tokens and
//! targets travel together. Every variation keeps its requests sorted by arrival and
//! is left out when it would hold none. This module only builds workloads; it runs
//! nothing and reads no file.

use nephele_placement::rng::Rng;

use crate::autoscale_llm::{Isolated, LlmProfile};
use crate::autoscale_trace::{Request, Workload};

/// One held-out variation of a trace.
#[derive(Debug, Clone)]
pub struct Variant {
    /// `first-half`, `rate-x2`, … (the table in the module documentation).
    pub name: String,
    /// One sentence: how it was made.
    pub what: String,
    /// The varied trace, named `trace/variant`.
    pub workload: Workload,
}

const DAY_US: u64 = 86_400_000_000;
const HOUR_S: f64 = 3600.0;

/// Every variation of `workload`, in the order of the module's table, from `seed`
/// (the same seed gives the same variations). Each variation draws from a stream of
/// its own, so adding one never changes another. An empty workload has none.
pub fn variations(workload: &Workload, seed: u64) -> Vec<Variant> {
    let mut template = workload.clone();
    let mut requests = std::mem::take(&mut template.requests);
    requests.sort_by_key(|r| r.arrival_us);
    if requests.is_empty() {
        return Vec::new();
    }
    let source = Source {
        template: &template,
    };
    let stream = |salt: u64| Rng::new(seed ^ salt);
    let mut variants = Vec::new();

    let (first, second) = halves(&requests);
    variants.push(source.reorigined(
        "first-half",
        "The requests that arrive before half of the trace's span (its tune part), re-origined to the first of them.".into(),
        first,
    ));
    variants.push(source.reorigined(
        "second-half",
        "The requests that arrive from half of the trace's span on (its held-out part), re-origined to the first of them with the wall clock kept.".into(),
        second,
    ));

    for (keep, salt) in [(0.25, 0x7a1e_0025), (0.5, 0x7a1e_0050)] {
        let mut rng = stream(salt);
        let kept = requests
            .iter()
            .copied()
            .filter(|_| unit(&mut rng) < keep)
            .collect();
        variants.push(source.variant(
            &format!("rate-x{keep}"),
            format!("Each request kept with probability {keep} (Bernoulli thinning), arrival times unchanged."),
            kept,
        ));
    }

    for total in [2u64, 4] {
        let copies = total - 1;
        let plural = if copies == 1 { "copy" } else { "copies" };
        variants.push(source.variant(
            &format!("rate-x{total}"),
            format!("The trace overlaid with {copies} {plural} of itself, copy i's arrivals shifted circularly by i/{total} of the span (whole days, keeping the time of day, when the span is at least 2 days)."),
            superposed(&requests, total),
        ));
    }

    let mut rng = stream(0x5126_5b0f);
    let mut sizes = requests.clone();
    rng.shuffle(&mut sizes);
    let shuffled = requests
        .iter()
        .zip(&sizes)
        .map(|(at, size)| sized_like(at.arrival_us, size))
        .collect();
    variants.push(source.variant(
        "lengths-shuffled",
        "Arrivals unchanged; the requests' sizes (service, tokens and targets) permuted at random across them.".into(),
        shuffled,
    ));

    if !first.is_empty() && !second.is_empty() {
        let mut rng = stream(0x5ba9_4a1f);
        let mut draw_from = |half: &[Request]| half[rng.below(half.len() as u64) as usize];
        let mut swapped = Vec::with_capacity(requests.len());
        for request in first {
            swapped.push(sized_like(request.arrival_us, &draw_from(second)));
        }
        for request in second {
            swapped.push(sized_like(request.arrival_us, &draw_from(first)));
        }
        variants.push(source.variant(
            "lengths-swapped-halves",
            "Arrivals unchanged; each request takes the size of a request drawn at random (with replacement) from the other half of the trace.".into(),
            swapped,
        ));
    }

    for factor in [0.5, 2.0, 4.0] {
        let name = format!("lengths-x{factor}");
        let variant = match &template.llm {
            Some(profile) => {
                let (scaled, floor_ms) =
                    llm_lengths(profile, &requests, factor, template.target_floor_ms);
                let what = format!("Every request's output tokens × {factor} (at least 1, prompt unchanged), its service time and targets recomputed alone on an idle replica at its own slowdowns.");
                source.variant(&name, what, scaled).map(|mut variant| {
                    variant.workload.target_floor_ms = floor_ms;
                    variant
                })
            }
            None => {
                let floor_ms = template.target_floor_ms;
                let scaled = requests
                    .iter()
                    .map(|request| {
                        let service_ms = request.service_ms * factor;
                        Request {
                            service_ms,
                            target_ms: image_target_ms(service_ms, floor_ms),
                            ..*request
                        }
                    })
                    .collect();
                let what = format!("Every request's service time × {factor}, its target recomputed by the trace's rule (max(2 × service, service + floor)).");
                source.variant(&name, what, scaled)
            }
        };
        variants.push(variant);
    }

    variants.into_iter().flatten().collect()
}

/// The trace a variation starts from: its settings, without its requests.
struct Source<'a> {
    template: &'a Workload,
}

impl Source<'_> {
    /// A variation with `requests` on the trace's time axis; None when it has none.
    fn variant(&self, name: &str, what: String, requests: Vec<Request>) -> Option<Variant> {
        if requests.is_empty() {
            return None;
        }
        debug_assert!(requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us));
        let workload = Workload {
            name: format!("{}/{}", self.template.name, name),
            requests,
            ..self.template.clone()
        };
        Some(Variant {
            name: name.to_string(),
            what,
            workload,
        })
    }

    /// A variation of `part` (sorted) moved so that its first request arrives at 0,
    /// with the start moved by as much so that every request keeps its wall-clock time.
    fn reorigined(&self, name: &str, what: String, part: &[Request]) -> Option<Variant> {
        let origin_us = part.first()?.arrival_us;
        let moved = part
            .iter()
            .map(|request| Request {
                arrival_us: request.arrival_us - origin_us,
                ..*request
            })
            .collect();
        let mut variant = self.variant(name, what, moved)?;
        let (start_hour, start_offset_s) = moved_start(
            self.template.start_hour,
            self.template.start_offset_s,
            origin_us,
        );
        variant.workload.start_hour = start_hour;
        variant.workload.start_offset_s = start_offset_s;
        Some(variant)
    }
}

/// The requests before half of the span (the last arrival) and those from it on: the
/// same cut as the tune part of `nephele sim autoscale` (`arrival < span / 2`).
fn halves(requests: &[Request]) -> (&[Request], &[Request]) {
    let span_us = requests.last().map_or(0, |r| r.arrival_us);
    let cut_us = span_us / 2;
    requests.split_at(requests.partition_point(|r| r.arrival_us < cut_us))
}

/// The start `by_us` later: (hour since 1970, seconds into it, in `0..3600`).
fn moved_start(start_hour: i64, start_offset_s: f64, by_us: u64) -> (i64, f64) {
    let seconds = start_offset_s + by_us as f64 / 1e6;
    let hours = (seconds / HOUR_S).floor();
    let offset_s = (seconds - hours * HOUR_S).clamp(0.0, HOUR_S);
    (start_hour.saturating_add(hours as i64), offset_s)
}

/// Uniform in `[0, 1)`.
fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `size`'s request arriving at `arrival_us`.
fn sized_like(arrival_us: u64, size: &Request) -> Request {
    Request {
        arrival_us,
        ..*size
    }
}

/// The trace and `total - 1` copies of it, copy `i`'s arrivals shifted circularly by
/// [`copy_shift`], sorted by arrival (stably: the trace's own requests first at a tie).
///
/// The circle is the span plus 1 µs, so every arrival stays within the span. When the
/// span is at least 2 days the shifts are whole days, and so is the circle: the span
/// plus 1 µs rounded down to whole days (the partial last day folds onto the first),
/// so that every copied request keeps its time of day and the daily cycles of the
/// copies stay aligned.
fn superposed(requests: &[Request], total: u64) -> Vec<Request> {
    let span_us = requests.last().map_or(0, |r| r.arrival_us);
    let circle_us = circle_us(span_us);
    let mut all = Vec::with_capacity(requests.len().saturating_mul(total as usize));
    all.extend_from_slice(requests);
    for copy in 1..total {
        let shift_us = u128::from(copy_shift(span_us, copy, total));
        all.extend(requests.iter().map(|request| Request {
            arrival_us: ((u128::from(request.arrival_us) + shift_us) % circle_us) as u64,
            ..*request
        }));
    }
    all.sort_by_key(|r| r.arrival_us);
    all
}

/// The circle copies are shifted around (see [`superposed`]).
fn circle_us(span_us: u64) -> u128 {
    let circle = u128::from(span_us) + 1;
    if span_us >= 2 * DAY_US {
        circle / u128::from(DAY_US) * u128::from(DAY_US)
    } else {
        circle
    }
}

/// Copy `copy` of `total`'s shift: `copy × span / total`, or when the span is at least
/// 2 days the whole number of days nearest to it.
fn copy_shift(span_us: u64, copy: u64, total: u64) -> u64 {
    let exact = u128::from(span_us) * u128::from(copy) / u128::from(total.max(1));
    let shift = if span_us >= 2 * DAY_US {
        let day = u128::from(DAY_US);
        (exact + day / 2) / day * day
    } else {
        exact
    };
    u64::try_from(shift).unwrap_or(u64::MAX)
}

/// The image rule of `autoscale_trace`: twice the service time, and at least the
/// service time plus the floor.
fn image_target_ms(service_ms: f64, floor_ms: f64) -> f64 {
    (2.0 * service_ms).max(service_ms + floor_ms)
}

/// `tokens × factor`, rounded, at least 1.
fn scaled_tokens(tokens: u32, factor: f64) -> u32 {
    (f64::from(tokens) * factor)
        .round()
        .clamp(1.0, f64::from(u32::MAX)) as u32
}

/// LLM requests with `factor` × their output tokens, service time and targets
/// recomputed on an idle replica at each request's own slowdowns (old target over the
/// old request alone), and the new floor as `autoscale_trace` computes it (the mean
/// wait before its prefill that a request's first-token target allows).
///
/// A request with one output token had no time between tokens (its target was 0 ×
/// the slowdown); if it now has more, its between-token slowdown is the trace's
/// usual one (the median over the requests that had one), or failing any, its own
/// end-to-end slowdown. The floor stays `old_floor_ms` if no request has a finite
/// first-token target.
fn llm_lengths(
    profile: &LlmProfile,
    requests: &[Request],
    factor: f64,
    old_floor_ms: f64,
) -> (Vec<Request>, f64) {
    let before: Vec<Isolated> = requests
        .iter()
        .map(|r| profile.isolated(r.prompt_tokens, r.output_tokens))
        .collect();
    let mut tbt_slowdowns: Vec<f64> = requests
        .iter()
        .zip(&before)
        .filter(|(_, alone)| alone.tbt_ms > 0.0)
        .map(|(r, alone)| r.tbt_target_ms / alone.tbt_ms)
        .filter(|ratio| ratio.is_finite())
        .collect();
    tbt_slowdowns.sort_by(f64::total_cmp);
    let usual_tbt_slowdown = tbt_slowdowns.get(tbt_slowdowns.len() / 2).copied();

    let mut wait_sum_ms = 0.0;
    let mut wait_count = 0usize;
    let scaled = requests
        .iter()
        .zip(&before)
        .map(|(request, old)| {
            let output_tokens = scaled_tokens(request.output_tokens, factor);
            let new = profile.isolated(request.prompt_tokens, output_tokens);
            let e2e_slowdown = request.target_ms / old.e2e_ms;
            let tbt_fallback = usual_tbt_slowdown.unwrap_or(e2e_slowdown);
            let ttft_target_ms = rescaled(request.ttft_target_ms, old.ttft_ms, new.ttft_ms, 1.0);
            let ttft_slowdown = ttft_target_ms / new.ttft_ms;
            let wait_ms = ttft_target_ms * (1.0 - 1.0 / ttft_slowdown.max(1.0));
            if wait_ms.is_finite() {
                wait_sum_ms += wait_ms;
                wait_count += 1;
            }
            Request {
                service_ms: new.e2e_ms,
                target_ms: rescaled(request.target_ms, old.e2e_ms, new.e2e_ms, e2e_slowdown),
                output_tokens,
                ttft_target_ms,
                tbt_target_ms: rescaled(
                    request.tbt_target_ms,
                    old.tbt_ms,
                    new.tbt_ms,
                    tbt_fallback,
                ),
                ..*request
            }
        })
        .collect();
    let floor_ms = match wait_count {
        0 => old_floor_ms,
        count => wait_sum_ms / count as f64,
    };
    (scaled, floor_ms)
}

/// `old_target_ms` at the same slowdown over `new_alone_ms` as it had over
/// `old_alone_ms`, or at `fallback` when the old figure was 0. An infinite (unset)
/// target stays so.
fn rescaled(old_target_ms: f64, old_alone_ms: f64, new_alone_ms: f64, fallback: f64) -> f64 {
    if !old_target_ms.is_finite() {
        old_target_ms
    } else if old_alone_ms > 0.0 {
        old_target_ms / old_alone_ms * new_alone_ms
    } else {
        fallback * new_alone_ms
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::autoscale_llm::SlowdownTarget;
    use crate::autoscale_trace::gpu_price;

    const IMAGE_FLOOR_MS: f64 = 10_000.0;

    fn workload(requests: Vec<Request>, llm: Option<LlmProfile>, floor_ms: f64) -> Workload {
        Workload {
            name: "synthetic".into(),
            path: PathBuf::from("synthetic.csv"),
            start_hour: 470_000,
            start_offset_s: 1234.5,
            concurrency: 1,
            gpu: gpu_price("A10G-24GB").expect("price row"),
            gpus_per_replica: 1,
            llm,
            service_model: "test".into(),
            target_rule: "test".into(),
            target_floor_ms: floor_ms,
            requests,
        }
    }

    /// `n` image requests spread over `span_us` with varied service times.
    fn images(n: u64, span_us: u64) -> Workload {
        let requests = (0..n)
            .map(|index| {
                let arrival_us = if n > 1 { index * span_us / (n - 1) } else { 0 };
                let service_ms = 500.0 + (index * 7919 % 40_000) as f64;
                Request::timed(
                    arrival_us,
                    service_ms,
                    image_target_ms(service_ms, IMAGE_FLOOR_MS),
                )
            })
            .collect();
        workload(requests, None, IMAGE_FLOOR_MS)
    }

    /// LLM requests built as `autoscale_trace` builds the Azure trace's.
    fn llm(tokens: &[(u32, u32)]) -> Workload {
        let profile = LlmProfile::llama2_70b_h100_tp2();
        let slowdown = SlowdownTarget::SPLITWISE_P99;
        let requests: Vec<Request> = tokens
            .iter()
            .enumerate()
            .map(|(index, &(prompt, output))| {
                let alone = profile.isolated(prompt, output);
                Request {
                    arrival_us: index as u64 * 250_000,
                    service_ms: alone.e2e_ms,
                    target_ms: slowdown.e2e * alone.e2e_ms,
                    prompt_tokens: prompt,
                    output_tokens: output,
                    ttft_target_ms: slowdown.ttft * alone.ttft_ms,
                    tbt_target_ms: slowdown.tbt * alone.tbt_ms,
                }
            })
            .collect();
        let floor_ms = requests
            .iter()
            .map(|r| r.ttft_target_ms * (1.0 - 1.0 / slowdown.ttft))
            .sum::<f64>()
            / requests.len() as f64;
        workload(requests, Some(profile), floor_ms)
    }

    fn find<'a>(variants: &'a [Variant], name: &str) -> &'a Workload {
        &variants
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no variant {name}"))
            .workload
    }

    fn sorted(requests: &[Request]) -> bool {
        requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us)
    }

    /// Everything but the arrival, comparable and sortable.
    fn size_key(r: &Request) -> (u64, u64, u32, u32, u64, u64) {
        (
            r.service_ms.to_bits(),
            r.target_ms.to_bits(),
            r.prompt_tokens,
            r.output_tokens,
            r.ttft_target_ms.to_bits(),
            r.tbt_target_ms.to_bits(),
        )
    }

    fn sizes(requests: &[Request]) -> Vec<(u64, u64, u32, u32, u64, u64)> {
        let mut keys: Vec<_> = requests.iter().map(size_key).collect();
        keys.sort();
        keys
    }

    fn wall_clock_s(workload: &Workload, request: &Request) -> f64 {
        workload.start_hour as f64 * 3600.0
            + workload.start_offset_s
            + request.arrival_us as f64 / 1e6
    }

    #[test]
    fn every_variant_in_order_named_sorted_and_non_empty() {
        let trace = images(200, 3_600_000_000);
        let variants = variations(&trace, 1);
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "first-half",
                "second-half",
                "rate-x0.25",
                "rate-x0.5",
                "rate-x2",
                "rate-x4",
                "lengths-shuffled",
                "lengths-swapped-halves",
                "lengths-x0.5",
                "lengths-x2",
                "lengths-x4",
            ]
        );
        for variant in &variants {
            assert_eq!(variant.workload.name, format!("synthetic/{}", variant.name));
            assert!(!variant.workload.requests.is_empty(), "{}", variant.name);
            assert!(sorted(&variant.workload.requests), "{}", variant.name);
            assert!(!variant.what.is_empty());
        }
    }

    #[test]
    fn empty_and_tiny_traces_do_not_panic() {
        assert!(variations(&images(0, 0), 3).is_empty());
        let one = variations(&images(1, 0), 3);
        assert!(one.iter().all(|v| !v.workload.requests.is_empty()));
        // One request at 0: nothing arrives before half of a zero span.
        assert!(one.iter().all(|v| v.name != "first-half"));
        assert!(one.iter().any(|v| v.name == "second-half"));
        assert_eq!(find(&one, "rate-x4").requests.len(), 4);
        let unsorted = workload(
            vec![
                Request::timed(5_000_000, 1.0, 2.0),
                Request::timed(0, 3.0, 6.0),
            ],
            None,
            0.0,
        );
        for variant in variations(&unsorted, 9) {
            assert!(sorted(&variant.workload.requests), "{}", variant.name);
        }
        let odd_llm = workload(
            vec![Request::timed(0, f64::NAN, f64::INFINITY)],
            Some(LlmProfile::llama2_70b_h100_tp2()),
            f64::NAN,
        );
        let odd = variations(&odd_llm, 0);
        for name in [
            "second-half",
            "lengths-shuffled",
            "lengths-x4",
            "rate-x2",
            "rate-x4",
        ] {
            let expected = match name {
                "rate-x2" => 2,
                "rate-x4" => 4,
                _ => 1,
            };
            assert_eq!(find(&odd, name).requests.len(), expected, "{name}");
        }
        // Thinning one request may leave none: that variant is then left out, never empty.
        assert!(odd.iter().all(|v| !v.workload.requests.is_empty()));
    }

    #[test]
    fn thinning_keeps_about_the_stated_share_on_the_same_time_axis() {
        let trace = images(10_000, 3_600_000_000);
        let variants = variations(&trace, 42);
        for (name, share) in [("rate-x0.25", 0.25), ("rate-x0.5", 0.5)] {
            let thinned = find(&variants, name);
            let kept = thinned.requests.len() as f64 / 10_000.0;
            assert!((kept - share).abs() < 0.02, "{name}: kept {kept}");
            assert_eq!(thinned.start_hour, trace.start_hour);
            assert_eq!(thinned.start_offset_s, trace.start_offset_s);
            // A subset of the trace's requests, unchanged.
            let mut left = trace.requests.iter();
            for request in &thinned.requests {
                assert!(left.any(|r| r == request), "{name}: {request:?}");
            }
        }
    }

    #[test]
    fn superposition_multiplies_the_count_and_keeps_span_and_order() {
        let trace = images(1_000, 7_200_000_000);
        let span_us = trace.requests.last().expect("requests").arrival_us;
        let variants = variations(&trace, 5);
        for (name, total) in [("rate-x2", 2usize), ("rate-x4", 4)] {
            let over = find(&variants, name);
            assert_eq!(over.requests.len(), total * trace.requests.len());
            assert_eq!(over.requests.last().expect("requests").arrival_us, span_us);
            assert_eq!(over.requests[0].arrival_us, 0);
            assert!(sorted(&over.requests));
            let expected: Vec<_> = sizes(&trace.requests)
                .into_iter()
                .flat_map(|key| std::iter::repeat_n(key, total))
                .collect();
            assert_eq!(sizes(&over.requests), expected, "{name}");
        }
        // Under 2 days, copy i of k is shifted by exactly i·span/k around span + 1 µs.
        let mut arrivals: Vec<u64> = find(&variants, "rate-x2")
            .requests
            .iter()
            .map(|r| r.arrival_us)
            .collect();
        let mut expected: Vec<u64> = trace
            .requests
            .iter()
            .flat_map(|r| [r.arrival_us, (r.arrival_us + span_us / 2) % (span_us + 1)])
            .collect();
        arrivals.sort();
        expected.sort();
        assert_eq!(arrivals, expected);
    }

    #[test]
    fn day_aligned_shifts_keep_each_arrival_time_of_day() {
        let span_us = 3 * DAY_US + DAY_US / 2 + 12_345;
        let trace = images(3_000, span_us);
        let variants = variations(&trace, 11);
        let time_of_day_us = |workload: &Workload| {
            let start_us = (workload.start_hour as f64 * 3600.0 + workload.start_offset_s) * 1e6;
            let start_in_day_us = (start_us as u64) % DAY_US;
            let mut times: Vec<u64> = workload
                .requests
                .iter()
                .map(|r| (start_in_day_us + r.arrival_us) % DAY_US)
                .collect();
            times.sort();
            times
        };
        let original = time_of_day_us(&trace);
        for (name, total) in [("rate-x2", 2usize), ("rate-x4", 4)] {
            let over = find(&variants, name);
            assert!(over.requests.last().expect("requests").arrival_us <= span_us);
            let expected: Vec<u64> = original
                .iter()
                .flat_map(|&t| std::iter::repeat_n(t, total))
                .collect();
            assert_eq!(time_of_day_us(over), expected, "{name}");
            // And the copies really moved: not every request sits where the trace's does.
            let own: std::collections::HashSet<u64> =
                trace.requests.iter().map(|r| r.arrival_us).collect();
            assert!(over.requests.iter().any(|r| !own.contains(&r.arrival_us)));
        }
        assert_eq!(copy_shift(span_us, 1, 4), DAY_US);
        assert_eq!(copy_shift(span_us, 2, 4), 2 * DAY_US);
        assert_eq!(copy_shift(span_us, 3, 4), 3 * DAY_US);
    }

    #[test]
    fn halves_partition_the_requests_and_are_reorigined_on_the_wall_clock() {
        let trace = images(1_001, 10 * 3_600_000_000 + 777);
        let span_us = trace.requests.last().expect("requests").arrival_us;
        let variants = variations(&trace, 2);
        let first = find(&variants, "first-half");
        let second = find(&variants, "second-half");
        assert_eq!(
            first.requests.len() + second.requests.len(),
            trace.requests.len()
        );
        assert_eq!(first.requests[0].arrival_us, 0);
        assert_eq!(second.requests[0].arrival_us, 0);
        for half in [first, second] {
            assert!((0.0..3600.0).contains(&half.start_offset_s));
        }
        let rejoined: Vec<Request> = first
            .requests
            .iter()
            .chain(&second.requests)
            .copied()
            .collect();
        for ((request, original), half) in rejoined
            .iter()
            .zip(&trace.requests)
            .zip(std::iter::repeat_n(first, first.requests.len()).chain(std::iter::repeat(second)))
        {
            assert_eq!(size_key(request), size_key(original));
            let moved_s = wall_clock_s(half, request) - wall_clock_s(&trace, original);
            assert!(moved_s.abs() < 1e-3, "{moved_s}");
        }
        let cut_us = span_us / 2;
        let before = trace
            .requests
            .iter()
            .filter(|r| r.arrival_us < cut_us)
            .count();
        assert_eq!(first.requests.len(), before);
        assert_ne!(second.start_hour, trace.start_hour);
    }

    #[test]
    fn shuffling_keeps_arrivals_and_the_multiset_of_sizes() {
        let trace = llm(&[
            (100, 5),
            (2000, 300),
            (50, 1),
            (800, 40),
            (4000, 12),
            (10, 99),
        ]);
        let variants = variations(&trace, 8);
        let shuffled = find(&variants, "lengths-shuffled");
        let arrivals = |w: &Workload| w.requests.iter().map(|r| r.arrival_us).collect::<Vec<_>>();
        assert_eq!(arrivals(shuffled), arrivals(&trace));
        assert_eq!(sizes(&shuffled.requests), sizes(&trace.requests));
        assert_ne!(shuffled.requests, trace.requests);
    }

    #[test]
    fn swapped_halves_take_sizes_from_the_other_half() {
        let trace = images(400, 3_600_000_000);
        let (first, second) = halves(&trace.requests);
        let first_sizes: Vec<_> = first.iter().map(size_key).collect();
        let second_sizes: Vec<_> = second.iter().map(size_key).collect();
        let variants = variations(&trace, 4);
        let swapped = find(&variants, "lengths-swapped-halves");
        assert_eq!(swapped.requests.len(), trace.requests.len());
        for (index, (request, original)) in swapped.requests.iter().zip(&trace.requests).enumerate()
        {
            assert_eq!(request.arrival_us, original.arrival_us);
            let other = if index < first.len() {
                &second_sizes
            } else {
                &first_sizes
            };
            assert!(other.contains(&size_key(request)), "request {index}");
        }
    }

    #[test]
    fn longer_llm_outputs_raise_service_and_targets_at_the_same_slowdowns() {
        let trace = llm(&[(1000, 10), (4808, 100), (300, 1), (20_000, 3)]);
        let profile = LlmProfile::llama2_70b_h100_tp2();
        let slowdown = SlowdownTarget::SPLITWISE_P99;
        let variants = variations(&trace, 6);
        let doubled = find(&variants, "lengths-x2");
        for (new, old) in doubled.requests.iter().zip(&trace.requests) {
            assert_eq!(new.arrival_us, old.arrival_us);
            assert_eq!(new.prompt_tokens, old.prompt_tokens);
            assert_eq!(new.output_tokens, 2 * old.output_tokens);
            let alone = profile.isolated(new.prompt_tokens, new.output_tokens);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
            assert!(close(new.service_ms, alone.e2e_ms));
            assert!(new.service_ms > old.service_ms);
            assert!(close(new.target_ms, slowdown.e2e * alone.e2e_ms));
            assert!(new.target_ms > old.target_ms);
            assert!(close(new.ttft_target_ms, slowdown.ttft * alone.ttft_ms));
            assert!(close(new.ttft_target_ms, old.ttft_target_ms));
            // Including the request that had one output token (no between-token time).
            assert!(
                close(new.tbt_target_ms, slowdown.tbt * alone.tbt_ms),
                "{new:?}"
            );
            assert!(new.within(alone.e2e_ms, Some(alone.ttft_ms)));
        }
        let floor_ms = doubled
            .requests
            .iter()
            .map(|r| r.ttft_target_ms * (1.0 - 1.0 / slowdown.ttft))
            .sum::<f64>()
            / doubled.requests.len() as f64;
        assert!((doubled.target_floor_ms - floor_ms).abs() < 1e-9);
        let halved = find(&variants, "lengths-x0.5");
        let outputs: Vec<u32> = halved.requests.iter().map(|r| r.output_tokens).collect();
        assert_eq!(outputs, [5, 50, 1, 2]);
    }

    #[test]
    fn longer_image_requests_follow_the_trace_rule() {
        let trace = images(50, 600_000_000);
        let variants = variations(&trace, 6);
        for (name, factor) in [
            ("lengths-x0.5", 0.5),
            ("lengths-x2", 2.0),
            ("lengths-x4", 4.0),
        ] {
            let scaled = find(&variants, name);
            assert_eq!(scaled.target_floor_ms, IMAGE_FLOOR_MS);
            for (new, old) in scaled.requests.iter().zip(&trace.requests) {
                assert_eq!(new.arrival_us, old.arrival_us);
                assert_eq!(new.service_ms, old.service_ms * factor);
                assert_eq!(
                    new.target_ms,
                    (2.0 * new.service_ms).max(new.service_ms + IMAGE_FLOOR_MS)
                );
            }
        }
    }

    #[test]
    fn same_seed_same_variants_other_seed_other_draws() {
        let trace = images(2_000, 3_600_000_000);
        let requests = |seed: u64| -> Vec<(String, Vec<Request>)> {
            variations(&trace, seed)
                .into_iter()
                .map(|v| (v.name, v.workload.requests))
                .collect()
        };
        assert_eq!(requests(17), requests(17));
        let other = variations(&trace, 18);
        let this = variations(&trace, 17);
        assert_ne!(
            find(&this, "rate-x0.5").requests,
            find(&other, "rate-x0.5").requests
        );
        assert_eq!(
            find(&this, "rate-x2").requests,
            find(&other, "rate-x2").requests
        );
    }
}
