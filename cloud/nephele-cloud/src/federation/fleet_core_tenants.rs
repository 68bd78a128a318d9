//! Tenants as API objects: created and changed (`PUT /v1/tenants/{name}`) and deleted
//! (`DELETE`) by admins, each change written, audited by the API, and told to every
//! region (its scheduler's weights and quotas change at once; nothing running is
//! evicted for a lowered quota). A `[[tenant]]` of the config creates the tenant at
//! start when the store has none of that name ([`seeded`]); after that the stored
//! values count. Same contract as the rest of the core: commands in, reply + writes +
//! effects out.

use std::collections::BTreeMap;

use super::access::{visible, Principal};
use super::fleet_core::{Effect, FleetCore, Output, RegionNote};
use super::fleet_store::{Record, Write};
use super::views::TenantView;
use super::ApiError;
use crate::config::{CloudConfig, TenantConfig};
use crate::store::{DeploymentRecord, TenantRecord};

/// The tenants the config declares that `stored` lacks, as records to write: every
/// `[[tenant]]`, or `default` alone when the config declares none and nothing is
/// stored (a fresh single-tenant control plane).
pub fn seeded(
    config: &CloudConfig,
    stored: &BTreeMap<String, TenantRecord>,
    now_unix: u64,
) -> Vec<TenantRecord> {
    let declared: Vec<TenantConfig> = if config.tenants.is_empty() {
        if stored.is_empty() {
            vec![TenantConfig::named(&crate::store::default_tenant())]
        } else {
            Vec::new()
        }
    } else {
        config.tenants.clone()
    };
    declared
        .into_iter()
        .filter(|t| !stored.contains_key(&t.name))
        .map(|tenant| TenantRecord {
            tenant,
            created_unix: now_unix,
            updated_unix: now_unix,
            updated_by: "config".into(),
        })
        .collect()
}

/// Most replicas a deployment may ask for in each region, as its regions size it.
fn replicas_asked(record: &DeploymentRecord, config: &CloudConfig) -> u32 {
    if !record.offload {
        return 0;
    }
    let min = record.replicas.min.unwrap_or(config.autoscale.min_replicas);
    record
        .replicas
        .max
        .unwrap_or(config.autoscale.max_replicas)
        .max(min)
}

impl FleetCore {
    /// The tenants, by name.
    pub fn tenant_names(&self) -> Vec<String> {
        self.records.tenants.keys().cloned().collect()
    }

    /// Every tenant's weight and quotas, for the region schedulers.
    pub fn tenant_specs(&self) -> Vec<TenantConfig> {
        self.records
            .tenants
            .values()
            .map(|r| r.tenant.clone())
            .collect()
    }

    pub(super) fn check_tenant(&self, tenant: &str) -> Result<(), ApiError> {
        if self.records.tenants.contains_key(tenant) {
            return Ok(());
        }
        Err(ApiError::invalid(
            "tenant",
            format!(
                "no tenant {tenant:?}; tenants: {} (an admin creates one: `nephele tenant create {tenant}`)",
                self.tenant_names().join(", ")
            ),
        ))
    }

    fn tenant_view(&self, record: &TenantRecord) -> TenantView {
        let name = &record.tenant.name;
        let owned: Vec<&DeploymentRecord> = self
            .catalog
            .deployments()
            .filter(|d| &d.tenant == name)
            .collect();
        TenantView {
            name: name.clone(),
            weight: record.tenant.weight,
            quota_cpu_milli: record.tenant.quota_cpu_milli,
            quota_memory_mib: record.tenant.quota_memory_mib,
            quota_gpu_milli: record.tenant.quota_gpu_milli,
            quota_jobs: record.tenant.quota_jobs,
            quota_replicas: record.tenant.quota_replicas,
            api_tokens: self
                .records
                .api_tokens
                .values()
                .filter(|r| &r.tenant == name && r.revoked_unix.is_none())
                .count(),
            models: self.catalog.models().filter(|m| &m.tenant == name).count(),
            deployments: owned.len(),
            replicas_asked: owned.iter().map(|d| replicas_asked(d, &self.config)).sum(),
            declared_in_config: self.config.tenants.iter().any(|t| &t.name == name),
            created_unix: record.created_unix,
            updated_unix: record.updated_unix,
            updated_by: record.updated_by.clone(),
        }
    }

    /// The tenants `scope` sees (every one for admins), with their quotas and holdings.
    pub fn tenant_views(&self, scope: Option<&str>) -> Vec<TenantView> {
        self.records
            .tenants
            .values()
            .filter(|r| visible(scope, &r.tenant.name))
            .map(|r| self.tenant_view(r))
            .collect()
    }

    /// One tenant `scope` may see.
    pub fn tenant(&self, name: &str, scope: Option<&str>) -> Result<TenantView, ApiError> {
        match self.records.tenants.get(name) {
            Some(record) if visible(scope, name) => Ok(self.tenant_view(record)),
            _ => Err(ApiError::NotFound(format!(
                "no tenant {name}{}",
                scope.map_or_else(String::new, |t| format!(" visible to tenant {t}"))
            ))),
        }
    }

    /// Creates or changes a tenant (admins). Its regions take the new weight and
    /// quotas at once. Whether it was created, and its view.
    pub fn put_tenant(
        &mut self,
        now_unix: u64,
        name: &str,
        spec: TenantConfig,
        by: &Principal,
    ) -> Output<Result<(bool, TenantView), ApiError>> {
        self.begin();
        let checked = (|| {
            if spec.name != name {
                return Err(ApiError::invalid(
                    "name",
                    format!(
                        "the body names tenant {:?} but the path {name:?}; a tenant cannot be renamed",
                        spec.name
                    ),
                ));
            }
            if let Some((field, message)) = spec.problem() {
                return Err(ApiError::invalid(field, message));
            }
            if let Some(quota) = spec.quota_replicas {
                let asked = self.replicas_of(name, None, 0);
                if asked > quota {
                    return Err(ApiError::invalid(
                        "quota_replicas",
                        format!(
                            "tenant {name}'s deployments ask for {asked} replicas (the sum of their replicas.max) already; lower those first, or allow at least {asked}"
                        ),
                    ));
                }
            }
            Ok(())
        })();
        if let Err(error) = checked {
            return self.finish(Err(error), Vec::new());
        }
        let before = self.records.tenants.get(name).cloned();
        let created = before.is_none();
        let record = TenantRecord {
            tenant: spec.clone(),
            created_unix: before.as_ref().map_or(now_unix, |b| b.created_unix),
            updated_unix: now_unix,
            updated_by: by.describe(),
        };
        if before.as_ref().map(|b| &b.tenant) == Some(&spec) {
            let view = self.tenant_view(before.as_ref().unwrap_or(&record));
            return self.finish(Ok((false, view)), Vec::new());
        }
        tracing::info!(tenant = %name, created, by = %by.describe(), "tenant {}", if created { "created" } else { "changed" });
        self.write(Write::Put(Record::Tenant(record.clone())));
        let view = self.tenant_view(&record);
        let effects = vec![Effect::Region(RegionNote::Tenant {
            tenant: spec,
            removed: false,
        })];
        self.finish(Ok((created, view)), effects)
    }

    /// Deletes a tenant (admins): refused while the config declares it, or while it
    /// has API tokens, models or deployments (the caller checks jobs in the regions
    /// first). Its regions stop taking its jobs.
    pub fn delete_tenant(
        &mut self,
        name: &str,
        by: &Principal,
    ) -> Output<Result<TenantView, ApiError>> {
        self.begin();
        let Some(record) = self.records.tenants.get(name).cloned() else {
            let error = ApiError::NotFound(format!("no tenant {name}"));
            return self.finish(Err(error), Vec::new());
        };
        let view = self.tenant_view(&record);
        let refusal = if view.declared_in_config {
            Some(format!(
                "tenant {name} is declared in the control plane's config ([[tenant]]), which would create it again at the next start; remove it there first"
            ))
        } else if by.tenant == name {
            Some(format!(
                "this token belongs to tenant {name}; delete it with another tenant's admin token"
            ))
        } else if view.api_tokens + view.models + view.deployments > 0 {
            Some(format!(
                "tenant {name} still has {} API token(s), {} model version(s) and {} deployment(s); revoke and delete them first",
                view.api_tokens, view.models, view.deployments
            ))
        } else {
            None
        };
        if let Some(message) = refusal {
            return self.finish(Err(ApiError::Conflict(message)), Vec::new());
        }
        tracing::info!(tenant = %name, by = %by.describe(), "tenant deleted");
        self.write(Write::Delete(
            crate::store::Table::Tenants,
            name.to_string(),
        ));
        let effects = vec![Effect::Region(RegionNote::Tenant {
            tenant: record.tenant,
            removed: true,
        })];
        self.finish(Ok(view), effects)
    }

    /// Replicas `tenant`'s deployments ask for, with `replacing` (a deployment being
    /// created or changed) counted as `asked` instead of its stored spec.
    fn replicas_of(&self, tenant: &str, replacing: Option<&str>, asked: u32) -> u32 {
        let others: u32 = self
            .catalog
            .deployments()
            .filter(|d| d.tenant == tenant && Some(d.name.as_str()) != replacing)
            .map(|d| replicas_asked(d, &self.config))
            .sum();
        others.saturating_add(asked)
    }

    /// Refuses a deployment whose replicas would take its tenant past its replica
    /// quota.
    pub(super) fn check_replica_quota(&self, record: &DeploymentRecord) -> Result<(), ApiError> {
        let Some(quota) = self
            .records
            .tenants
            .get(&record.tenant)
            .and_then(|t| t.tenant.quota_replicas)
        else {
            return Ok(());
        };
        let asked = replicas_asked(record, &self.config);
        let total = self.replicas_of(&record.tenant, Some(&record.name), asked);
        if total > quota {
            return Err(ApiError::invalid(
                "replicas.max",
                format!(
                    "quota exceeded: tenant {}'s deployments would ask for {total} cloud replicas (this one {asked}), over its quota of {quota}; ask for fewer (replicas.max, or offload: false), or have an admin raise quota_replicas",
                    record.tenant
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_seeds_only_what_the_store_lacks() {
        let mut config = CloudConfig::default();
        let none = BTreeMap::new();
        let seeded_default = seeded(&config, &none, 7);
        assert_eq!(seeded_default.len(), 1);
        assert_eq!(seeded_default[0].tenant.name, "default");
        assert_eq!(seeded_default[0].updated_by, "config");
        config.tenants = vec![TenantConfig::named("team-a"), TenantConfig::named("team-b")];
        let mut stored = BTreeMap::new();
        let mut changed = TenantConfig::named("team-a");
        changed.quota_gpu_milli = Some(4000);
        stored.insert(
            "team-a".to_string(),
            TenantRecord {
                tenant: changed,
                created_unix: 1,
                updated_unix: 2,
                updated_by: "token x".into(),
            },
        );
        let names: Vec<String> = seeded(&config, &stored, 9)
            .into_iter()
            .map(|r| r.tenant.name)
            .collect();
        // team-a's stored (changed) values stay; only team-b is created.
        assert_eq!(names, vec!["team-b"]);
        // Without [[tenant]] and with tenants stored, nothing is added.
        config.tenants.clear();
        assert!(seeded(&config, &stored, 9).is_empty());
    }
}
