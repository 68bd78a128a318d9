//! Building a region's scheduler from the control plane's config: node templates from
//! the pools' built-in firmware profiles, one slot per node a pool may have, the
//! tenants (and the internal serving tenant) and the placement queue.

use std::collections::BTreeMap;

use nephele_placement::grid::GridSeries;
use nephele_placement::queue::{Quota, Tenant};
use nephele_placement::workload;
use nephele_placement::{Cluster, Policy, Queue, QueueConfig};

use super::{ledger, nodes, RegionScheduler, Settings, SERVING_TENANT};
use crate::config::{node_spec, NodesConfig, RegionConfig, SchedulerConfig, TenantConfig};

impl RegionScheduler {
    pub fn new(
        region: &RegionConfig,
        tenants: &[TenantConfig],
        config: &SchedulerConfig,
    ) -> Result<RegionScheduler, String> {
        let policy = Policy::parse(&config.policy)
            .ok_or_else(|| format!("unknown scheduler policy {:?}", config.policy))?;
        let mut gpu_models: Vec<String> = Vec::new();
        let mut nodes = Vec::new();
        let mut slots = Vec::new();
        let mut templates = Vec::new();
        let mut pools = Vec::new();
        for (pool_index, pool) in region.pools.iter().enumerate() {
            let (template, model) = node_spec(&region.name, pool)?;
            let interned = model.as_ref().map(|m| {
                gpu_models.iter().position(|k| k == m).unwrap_or_else(|| {
                    gpu_models.push(m.clone());
                    gpu_models.len() - 1
                }) as u16
            });
            let mut shape = template.clone();
            shape.name = pool.name.clone();
            shape.gpu_model = interned;
            templates.push(shape);
            pools.push(nodes::PoolState::new(pool));
            for index in 0..pool.max_nodes {
                let mut spec = template.clone();
                spec.name = format!("{}-{index}", pool.name);
                spec.gpu_model = interned;
                slots.push(nodes::Slot::new(
                    &region.name,
                    pool,
                    pool_index,
                    index,
                    &spec.name,
                    model.clone(),
                ));
                nodes.push(spec);
            }
        }
        let mut cluster = Cluster::new(nodes);
        for node in 0..slots.len() {
            cluster.node_lost(node);
        }
        let mut quota_jobs: Vec<Option<u32>> = tenants.iter().map(|t| t.quota_jobs).collect();
        let mut tenant_list: Vec<Tenant> = if tenants.is_empty() {
            vec![Tenant {
                name: "default".into(),
                weight: 1.0,
                quota: Quota::default(),
            }]
        } else {
            tenants
                .iter()
                .map(|t| Tenant {
                    name: t.name.clone(),
                    weight: t.weight,
                    quota: Quota {
                        cpu_milli: t.quota_cpu_milli,
                        memory_mib: t.quota_memory_mib,
                        gpu_milli: t.quota_gpu_milli,
                    },
                })
                .collect()
        };
        if tenant_list.iter().any(|t| t.name == SERVING_TENANT) {
            return Err(format!(
                "tenant {SERVING_TENANT:?} is reserved for serving replicas; rename it"
            ));
        }
        let serving_tenant = tenant_list.len();
        quota_jobs.resize(serving_tenant + 1, None);
        tenant_list.push(Tenant {
            name: SERVING_TENANT.into(),
            weight: 1.0,
            quota: Quota::default(),
        });
        let queue_config = QueueConfig {
            policy,
            priorities: true,
            fairness: config.fairness,
            preemption: config.preemption,
            grace_seconds: config.grace_s,
            aging_seconds: (config.aging_s > 0).then_some(config.aging_s),
            seed: 0,
        };
        let tenant_names = tenant_list.iter().map(|t| t.name.clone()).collect();
        let mut queue = Queue::new(queue_config, tenant_list, workload::starting_mix());
        // Until it has seen enough of its own, and then from its latest RECENT_PODS.
        queue.learn_workload(workload::RECENT_PODS);
        Ok(RegionScheduler {
            region: region.name.clone(),
            carbon_zone: region.carbon_zone.clone(),
            grid: GridSeries::default(),
            templates: Cluster::new(templates),
            cluster,
            tenants: tenant_names,
            serving_tenant,
            queue,
            slots,
            pools,
            gpu_models,
            jobs: BTreeMap::new(),
            by_name: BTreeMap::new(),
            next_id: 1,
            replica_sets: BTreeMap::new(),
            settings: Settings::from(config),
            later: Vec::new(),
            next_uid: 1,
            ledger: ledger::Ledger::default(),
            removed_tenants: std::collections::BTreeSet::new(),
            quota_jobs,
            touched: std::collections::BTreeSet::new(),
            touched_all: true,
            holding: std::collections::BTreeSet::new(),
            with_processes: std::collections::BTreeSet::new(),
        })
    }

    /// With the node-provisioning settings (`[nodes]`) and how long an agent may be
    /// away before its node's work runs elsewhere.
    pub fn with_nodes(mut self, nodes: NodesConfig, lost_after_s: u64) -> Self {
        self.settings.nodes = nodes;
        self.settings.lost_after_s = lost_after_s.max(1);
        self
    }

    /// Where checkpoint directories go when the config names no `checkpoint_root`.
    pub fn with_default_checkpoint_root(mut self, root: &str) -> Self {
        if self.settings.checkpoint_root == "checkpoints" {
            self.settings.checkpoint_root = root.to_string();
        }
        self
    }

    pub fn region(&self) -> &str {
        &self.region
    }
}
