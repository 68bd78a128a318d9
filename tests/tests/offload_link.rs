//! Offload over a link that slows down and recovers (issue 14): an edge agent reaches
//! the control plane through a `ShapedLink`. While the link is fast its overflow goes to
//! the pool; once the round trip is far over the SLO the measured offload time rises
//! above it and the deployment keeps its overflow local or refuses it, probing the
//! cloud path at most twice a second; once the link is fast again, offload resumes
//! within seconds. Before, the estimate was updated only by offloads, which had
//! stopped, so the deployment answered 429 for as long as the agent ran.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nephele_e2e::{heldout, Cloud, Edge, Http, MODEL_ONNX};
use nephele_net::link::{LinkShape, ShapedLink};

/// One answered or refused request: when it was sent, its status, where it ran.
struct Outcome {
    sent: Instant,
    code: u16,
    cloud: bool,
}

/// `clients` closed-loop clients against `endpoint` for `duration`.
fn burst(
    endpoint: &str,
    rows: &Arc<Vec<Vec<f32>>>,
    clients: usize,
    duration: Duration,
) -> Vec<Outcome> {
    let until = Instant::now() + duration;
    let handles: Vec<_> = (0..clients)
        .map(|client| {
            let rows = rows.clone();
            let url = format!("{endpoint}/v1/infer/digits");
            std::thread::spawn(move || {
                let http = Http::new(None);
                let mut outcomes = Vec::new();
                let mut i = client;
                while Instant::now() < until {
                    let row = &rows[i % rows.len()];
                    i += clients;
                    let body = serde_json::json!({"shape": [1, 64], "data": row});
                    let sent = Instant::now();
                    let (code, reply) =
                        http.raw_json("POST", &url, &body).expect("agent reachable");
                    assert!(code == 200 || code == 429, "{code} {reply}");
                    if code == 429 {
                        // As a client honouring Retry-After would, briefly.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    outcomes.push(Outcome {
                        sent,
                        code,
                        cloud: reply["where"] == "cloud",
                    });
                }
                outcomes
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect()
}

#[test]
fn offload_resumes_within_seconds_after_a_slow_link_recovers() {
    let cloud = Cloud::start("offload-link").expect("cloud");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let upstream: SocketAddr = cloud.quic.parse().expect("the cloud's QUIC address");
    // 300 ms round trip: fifteen times the 20 ms SLO.
    let slow = LinkShape::new(Duration::from_millis(300), 50e6);
    let fast = LinkShape::new(Duration::ZERO, 1e9);
    let link = runtime
        .block_on(ShapedLink::start(upstream, fast))
        .expect("link");
    let via = link.local_addr().to_string();
    let lab = Edge::start_via(
        &cloud,
        &via,
        "lab-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &["--workers", "1"],
    )
    .expect("edge agent behind the link");
    let _pool = Edge::pool(&cloud, "pool-1", "eu-west").expect("pool agent");

    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert_eq!(status, 201, "{body}");
    cloud.deploy_on_one_edge_and_the_pool(serde_json::json!({"name": "digits",
        "model": "digits-mlp", "selector": "site=lab", "slo_ms": 20, "max_queue": 1}));

    let rows = Arc::new(heldout().features);
    let clients = 16;

    // Fast link: the overflow goes to the pool, and the agent measures it.
    let before = burst(&lab.endpoint, &rows, clients, Duration::from_secs(2));
    let before_cloud = before.iter().filter(|o| o.cloud).count();
    println!(
        "fast link (2 s): {} requests, {before_cloud} in the cloud",
        before.len()
    );
    assert!(
        before_cloud > 0,
        "the overflow goes to the pool over a fast link"
    );

    // Slow link: offloads measure 300 ms, and the overflow can no longer be answered
    // in time in the cloud.
    link.set_shape(slow).expect("slow link");
    let slowed = Instant::now();
    let slow_spell = Duration::from_secs(4);
    let slow_outcomes = burst(&lab.endpoint, &rows, clients, slow_spell);
    // Offloads decided on the fast estimate went out until the first slow one came back
    // (one round trip); from a second on only probes go.
    let settled = Duration::from_secs(1);
    let slow_cloud = slow_outcomes
        .iter()
        .filter(|o| o.cloud && o.sent.duration_since(slowed) >= settled)
        .count();
    let slow_refused = slow_outcomes.iter().filter(|o| o.code == 429).count();
    println!(
        "slow link (300 ms RTT, {} s): {} requests, {} in the cloud after the first second (probes), {} refused",
        slow_spell.as_secs(),
        slow_outcomes.len(),
        slow_cloud,
        slow_refused
    );
    assert!(
        slow_refused > 0,
        "the overloaded device must refuse some of its overflow"
    );
    // At most one probe per 500 ms, plus the ones out at the edges.
    assert!(
        slow_cloud <= ((slow_spell - settled).as_millis() / 500) as usize + 2,
        "over a slow link only probes go to the cloud: {slow_cloud}"
    );

    // The link recovers.
    link.set_shape(fast).expect("fast link");
    let recovered = Instant::now();
    let fast_spell = Duration::from_secs(6);
    let fast_outcomes = burst(&lab.endpoint, &rows, clients, fast_spell);
    let fast_cloud = fast_outcomes.iter().filter(|o| o.cloud).count();
    let first_cloud = fast_outcomes
        .iter()
        .filter(|o| o.cloud)
        .map(|o| o.sent.duration_since(recovered))
        .min()
        .expect("offload must resume after the link recovers");
    println!(
        "fast link ({} s): {} requests, {} in the cloud, {} refused; first offload sent {:.2} s after recovery",
        fast_spell.as_secs(),
        fast_outcomes.len(),
        fast_cloud,
        fast_outcomes.iter().filter(|o| o.code == 429).count(),
        first_cloud.as_secs_f64()
    );
    let per_second: Vec<usize> = (0..fast_spell.as_secs())
        .map(|second| {
            fast_outcomes
                .iter()
                .filter(|o| o.cloud && o.sent.duration_since(recovered).as_secs() == second)
                .count()
        })
        .collect();
    println!("in the cloud per second after recovery: {per_second:?}");
    assert!(
        first_cloud < Duration::from_secs(4),
        "offload resumes within seconds: the first went {first_cloud:?} after recovery"
    );
    // Resumed, not merely probed: within three seconds far more went to the cloud than
    // probes alone could carry (six at most).
    let resumed: usize = per_second.iter().take(3).sum();
    assert!(
        resumed > 100,
        "offload resumed for the overflow: {resumed} requests in the cloud in the first 3 s"
    );
    drop(link);
}

/// Joint inference across a cut link (issue 53): a hard example waits for the cloud
/// only until its request's deadline and then gets its local answer; once the link is
/// mended, hard examples go to the cloud again as soon as the transport hears from the
/// control plane, not after the breaker's backoff (which doubled with each failed
/// probe during the cut). Before, each hard example sent into the cut held its client
/// for max(20 × SLO, 2 s), and offload came back only when the doubled open time ran
/// out.
#[test]
fn across_a_cut_link_hard_examples_keep_their_deadline_and_come_back_with_the_path() {
    let cloud = Cloud::start("offload-cut").expect("cloud");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let upstream: SocketAddr = cloud.quic.parse().expect("the cloud's QUIC address");
    let link = runtime
        .block_on(ShapedLink::start(
            upstream,
            LinkShape::new(Duration::ZERO, 1e9),
        ))
        .expect("link");
    let via = link.local_addr().to_string();
    let edge = Edge::start_via(
        &cloud,
        &via,
        "edge-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "tier=edge"],
        &["--workers", "1"],
    )
    .expect("edge agent behind the link");
    let _pool = Edge::pool(&cloud, "pool-1", "eu-west").expect("pool agent");
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert_eq!(status, 201, "{body}");
    let slo = Duration::from_millis(200);
    cloud.deploy_on_one_edge_and_the_pool(serde_json::json!({"name": "digits",
        "model": "digits-mlp", "selector": "tier=edge", "slo_ms": slo.as_millis() as u64,
        "max_queue": 8, "hard_example_threshold": 0.9999}));
    let rows = heldout().features;
    // One request: its status, whether the cloud answered, how long it took.
    let ask = |i: usize| {
        let sent = Instant::now();
        let (code, reply) = edge.infer("digits", &rows[i % rows.len()]).expect("agent");
        (code, reply["where"] == "cloud", sent.elapsed(), reply)
    };
    let hard_in_cloud = (0..60).filter(|i| ask(*i).1).count();
    assert!(hard_in_cloud > 0, "some held-out digits are hard examples");

    // Cut for 10 s, asking all the while: the breaker opens, its probes fail and its
    // open time doubles (1, 2, 4 s…).
    link.set_cut(true);
    let cut = Instant::now();
    let (mut asked, mut slowest, mut i) = (0usize, Duration::ZERO, 0usize);
    while cut.elapsed() < Duration::from_secs(10) {
        let (code, cloud_answered, took, reply) = ask(i);
        i += 1;
        asked += 1;
        assert_eq!(code, 200, "the local answer stands during a cut: {reply}");
        assert!(!cloud_answered, "nothing crosses a cut link: {reply}");
        slowest = slowest.max(took);
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "cut link: {asked} requests, all answered locally; the slowest took {} ms (SLO {} ms)",
        slowest.as_millis(),
        slo.as_millis()
    );
    // The bound is the SLO with its 25 % tolerance (250 ms); before, 2 s.
    assert!(
        slowest < Duration::from_millis(1500),
        "a hard example held its client {} ms across the cut",
        slowest.as_millis()
    );

    link.set_cut(false);
    let mended = Instant::now();
    let back = loop {
        let (code, cloud_answered, _, reply) = ask(i);
        i += 1;
        assert_eq!(code, 200, "{reply}");
        if cloud_answered {
            break mended.elapsed();
        }
        assert!(
            mended.elapsed() < Duration::from_secs(30),
            "no hard example reached the cloud in 30 s after the link was mended"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "link mended: the first hard example answered in the cloud {} ms later",
        back.as_millis()
    );
    // The transport hears acknowledgements within a heartbeat (1 s); the breaker's
    // open time after a 10 s cut had doubled to 8 s.
    assert!(
        back < Duration::from_secs(4),
        "offload came back {} ms after the link was mended",
        back.as_millis()
    );
    drop(link);
}
