//! The resource model beyond CPU/memory/GPU: MIG slices, NVLink domains, labels and
//! taints, spot capacity, and the cost, carbon, locality and spread scorers.

#![allow(clippy::unwrap_used)]

use nephele_placement::rng::Rng;
use nephele_placement::*;

fn node(name: &str, gpus: u8) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_milli: 64_000,
        memory_mib: 262_144,
        gpus,
        gpu_model: Some(0),
        ..NodeSpec::default()
    }
}

fn gpu_pod(num_gpu: u8) -> PodRequest {
    PodRequest {
        cpu_milli: 1000,
        memory_mib: 1024,
        num_gpu,
        gpu_milli: 1000,
        ..PodRequest::default()
    }
}

fn place_all(
    cluster: &mut Cluster,
    pods: &[PodRequest],
    objective: &Objective,
) -> Vec<Result<Binding, Unschedulable>> {
    let priority: Vec<u32> = cluster.priority().to_vec();
    let typical = TypicalPods::default();
    let mut rng = Rng::new(1);
    pods.iter()
        .enumerate()
        .map(|(id, pod)| {
            let placement = place_with(cluster, pod, objective, &typical, &priority, &mut rng)?;
            cluster.reserve(id as u64, pod, &placement.binding).unwrap();
            Ok(placement.binding)
        })
        .collect()
}

#[test]
fn mig_slices_are_children_of_their_gpu_and_never_counted_twice() {
    let one_g = MigProfile::parse("1g.10gb").unwrap();
    assert_eq!(one_g.to_string(), "1g.10gb");
    assert_eq!(MigProfile::parse("9g.10gb"), None);
    let mut a100 = node("a100", 2);
    a100.mig = vec![MigPartition {
        gpu: 0,
        profile: one_g,
        count: 7,
    }];
    let mut cluster = Cluster::new(vec![a100]);
    let slice = PodRequest::mig(500, 1024, one_g);
    let mut pods = vec![slice.clone(); 7];
    pods.push(gpu_pod(1));
    let results = place_all(&mut cluster, &pods, &Objective::packing(Policy::Fgd));
    for result in &results[..7] {
        let binding = result.as_ref().unwrap();
        assert_eq!(binding.gpus[0].0, 0, "slices come from the MIG GPU");
        assert!(binding.mig.is_some());
    }
    // The whole-GPU pod never lands on the MIG GPU.
    assert_eq!(results[7].as_ref().unwrap().gpus, vec![(1, 1000)]);
    // GPU 0: 7 slices of 142 milli taken, 6 milli left that nothing can use.
    assert_eq!(cluster.state[0].gpu_left, vec![1000 - 7 * 142, 0]);
    assert!(cluster.accounting_holds());
    // An eighth slice has no room, and says so.
    let why = place(
        &cluster,
        &slice,
        Policy::Fgd,
        &TypicalPods::default(),
        &[0],
        &mut Rng::new(1),
    )
    .unwrap_err();
    assert_eq!(
        why.rejected.keys().copied().collect::<Vec<_>>(),
        vec![Reason::NoMigSlice]
    );
    // Releasing a slice gives it back to its partition.
    assert!(cluster.unreserve(3));
    assert_eq!(cluster.state[0].mig_free, vec![1]);
    assert!(cluster.accounting_holds());
}

#[test]
fn a_binding_that_names_a_mig_gpu_for_a_whole_gpu_pod_is_refused() {
    let mut a100 = node("a100", 1);
    a100.mig = vec![MigPartition {
        gpu: 0,
        profile: MigProfile::parse("3g.40gb").unwrap(),
        count: 2,
    }];
    let mut cluster = Cluster::new(vec![a100]);
    let pod = PodRequest {
        gpu_milli: 300,
        ..gpu_pod(1)
    };
    let binding = Binding {
        node: 0,
        gpus: vec![(0, 300)],
        mig: None,
    };
    assert_eq!(
        cluster.reserve(1, &pod, &binding),
        Err(ReserveError::DoesNotFit(Reason::InsufficientGpu))
    );
}

#[test]
fn same_nvlink_pods_stay_in_one_domain() {
    let mut big = node("dgx", 8);
    big.nvlink_domain = vec![0, 0, 0, 0, 1, 1, 1, 1];
    let mut cluster = Cluster::new(vec![big]);
    // Take GPU 0 so domain 0 has 3 free and domain 1 has 4.
    cluster
        .reserve(
            100,
            &gpu_pod(1),
            &Binding {
                node: 0,
                gpus: vec![(0, 1000)],
                mig: None,
            },
        )
        .unwrap();
    let pod = PodRequest {
        same_nvlink: true,
        ..gpu_pod(4)
    };
    let results = place_all(
        &mut cluster,
        std::slice::from_ref(&pod),
        &Objective::packing(Policy::BestFit),
    );
    let gpus: Vec<u8> = results[0]
        .as_ref()
        .unwrap()
        .gpus
        .iter()
        .map(|(g, _)| *g)
        .collect();
    assert_eq!(gpus, vec![4, 5, 6, 7]);
    // Now no domain has 4 free GPUs although 3 are free in total.
    let why = place(
        &cluster,
        &PodRequest {
            same_nvlink: true,
            ..gpu_pod(3)
        },
        Policy::BestFit,
        &TypicalPods::default(),
        &[0],
        &mut Rng::new(1),
    );
    assert!(why.is_ok(), "3 GPUs fit in domain 0");
    let why = place(
        &cluster,
        &PodRequest {
            same_nvlink: true,
            ..gpu_pod(4)
        },
        Policy::BestFit,
        &TypicalPods::default(),
        &[0],
        &mut Rng::new(1),
    )
    .unwrap_err();
    assert_eq!(
        why.rejected.keys().copied().collect::<Vec<_>>(),
        vec![Reason::InsufficientGpu]
    );
}

#[test]
fn selectors_taints_and_spot_filter_with_their_own_reasons() {
    let mut labelled = node("labelled", 1);
    labelled.labels.insert("accelerator".into(), "a100".into());
    let mut tainted = node("tainted", 1);
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        effect: TaintEffect::NoSchedule,
    });
    let mut spot = node("spot", 1);
    spot.capacity_type = CapacityType::Spot;
    let cluster = Cluster::new(vec![labelled, tainted, spot]);
    let mut pod = gpu_pod(1);
    pod.node_selector
        .insert("accelerator".into(), "h100".into());
    let why = place(
        &cluster,
        &pod,
        Policy::Fgd,
        &TypicalPods::default(),
        &[0, 1, 2],
        &mut Rng::new(1),
    )
    .unwrap_err();
    assert_eq!(why.rejected.get(&Reason::NodeSelectorMismatch), Some(&3));
    let pod = gpu_pod(1);
    let why = place(
        &Cluster::new(cluster.nodes[1..].to_vec()),
        &pod,
        Policy::Fgd,
        &TypicalPods::default(),
        &[0, 1],
        &mut Rng::new(1),
    )
    .unwrap_err();
    assert_eq!(
        why.to_string(),
        "0/2 nodes can take it: 1 untolerated taint, 1 spot not allowed"
    );
    let tolerant = PodRequest {
        tolerations: vec!["dedicated".into()],
        spot_ok: true,
        ..gpu_pod(1)
    };
    assert!(place(
        &cluster,
        &tolerant,
        Policy::Fgd,
        &TypicalPods::default(),
        &[0, 1, 2],
        &mut Rng::new(1)
    )
    .is_ok());
}

#[test]
fn cost_scorer_prefers_spot_only_when_the_expected_loss_is_small() {
    let mut on_demand = node("on-demand", 1);
    on_demand.price_micro_usd_per_hour = 4_000_000;
    let mut spot = node("spot", 1);
    spot.capacity_type = CapacityType::Spot;
    spot.price_micro_usd_per_hour = 1_500_000;
    // 20% chance per hour of losing the node.
    spot.interruptions_per_1000h = 200;
    let objective = Objective {
        weights: Weights {
            cost: 1.0,
            ..Weights::default()
        },
        ..Objective::packing(Policy::FirstFit)
    };
    let checkpointing = PodRequest {
        spot_ok: true,
        runtime_minutes: 600,
        checkpoint_minutes: 10,
        ..gpu_pod(1)
    };
    let mut cluster = Cluster::new(vec![on_demand.clone(), spot.clone()]);
    let chosen = place_all(&mut cluster, &[checkpointing], &objective);
    assert_eq!(
        chosen[0].as_ref().unwrap().node,
        1,
        "cheap spot, small loss"
    );
    // A 20-hour job without checkpoints would lose 10 h per interruption on average:
    // 1.5 * (1 + 0.2 * 10) = 4.5 $/h expected, more than on-demand.
    let fragile = PodRequest {
        spot_ok: true,
        runtime_minutes: 1200,
        checkpoint_minutes: 0,
        ..gpu_pod(1)
    };
    let mut cluster = Cluster::new(vec![on_demand, spot]);
    let chosen = place_all(&mut cluster, &[fragile], &objective);
    assert_eq!(chosen[0].as_ref().unwrap().node, 0);
}

#[test]
fn carbon_locality_and_spread_move_the_choice() {
    let mut nodes = Vec::new();
    for (idx, (region, zone)) in [(0u16, 0u16), (0, 1), (1, 2), (1, 3)]
        .into_iter()
        .enumerate()
    {
        let mut n = node(&format!("n{idx}"), 4);
        n.location = Location {
            region,
            zone,
            rack: u32::from(zone),
        };
        nodes.push(n);
    }
    // Carbon: region 1 is cleaner now.
    let green = Objective {
        weights: Weights {
            carbon: 1.0,
            ..Weights::default()
        },
        carbon_by_region: vec![400.0, 50.0],
        ..Objective::packing(Policy::FirstFit)
    };
    let mut cluster = Cluster::new(nodes.clone());
    let chosen = place_all(&mut cluster, &[gpu_pod(1)], &green);
    assert_eq!(
        cluster.nodes[chosen[0].as_ref().unwrap().node]
            .location
            .region,
        1
    );
    // Locality: the data is in zone 1.
    let near = Objective {
        weights: Weights {
            locality: 1.0,
            ..Weights::default()
        },
        ..Objective::packing(Policy::FirstFit)
    };
    let mut cluster = Cluster::new(nodes.clone());
    let pod = PodRequest {
        data_location: Some((0, 1)),
        ..gpu_pod(1)
    };
    let chosen = place_all(&mut cluster, &[pod], &near);
    assert_eq!(chosen[0].as_ref().unwrap().node, 1);
    // Spread: four replicas of one job land in four zones, although packing alone
    // (first-fit) would stack them on the first node.
    let replica = PodRequest {
        spread: Some(Spread {
            job: 7,
            level: DomainLevel::Zone,
        }),
        ..gpu_pod(1)
    };
    let mut cluster = Cluster::new(nodes);
    let chosen = place_all(
        &mut cluster,
        &vec![replica; 4],
        &Objective::packing(Policy::FirstFit),
    );
    let mut zones: Vec<u16> = chosen
        .iter()
        .map(|b| cluster.nodes[b.as_ref().unwrap().node].location.zone)
        .collect();
    zones.sort();
    assert_eq!(zones, vec![0, 1, 2, 3]);
}

#[test]
fn ours_leaves_a_scarce_gpu_model_to_the_pods_that_can_only_use_it() {
    // Two nodes alike but for the model; the node order prefers the scarce one (model
    // 1), which typed pods need: half of the workload accepts only model 1.
    let mut scarce = node("a-scarce", 4);
    scarce.gpu_model = Some(1);
    let plenty = node("b-plenty", 4);
    let mut typed = gpu_pod(1);
    typed.gpu_models = vec![1];
    let untyped = gpu_pod(1);
    let nodes = vec![scarce, plenty];
    let typical =
        TypicalPods::from_pods(&[typed.clone(), untyped.clone()], 1.0).with_supply(&nodes);
    // Half the demand on half the GPUs.
    assert!((typical.pressure_of(Some(1)) - 1.0).abs() < 1e-12);
    let mut cluster = Cluster::new(nodes);
    cluster.set_priority(&[0, 1]);
    let priority = cluster.priority().to_vec();
    let mut rng = Rng::new(1);
    let choose = |cluster: &Cluster, pod: &PodRequest, policy: Policy, rng: &mut Rng| {
        place(cluster, pod, policy, &typical, &priority, rng)
            .unwrap()
            .binding
            .node
    };
    // First-fit follows the node order onto the scarce model; ours does not.
    assert_eq!(choose(&cluster, &untyped, Policy::FirstFit, &mut rng), 0);
    assert_eq!(choose(&cluster, &untyped, Policy::Ours, &mut rng), 1);
    // The typed pod still goes where it must.
    let binding = place(
        &cluster,
        &typed,
        Policy::Ours,
        &typical,
        &priority,
        &mut rng,
    )
    .unwrap()
    .binding;
    assert_eq!(binding.node, 0);
    cluster.reserve(1, &typed, &binding).unwrap();
}
