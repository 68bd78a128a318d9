//! Who may do what through the API: roles, what each route needs, and which tenant's
//! objects a token sees. Pure: the API's middleware asks [`required`] for every `/v1`
//! request before its handler runs, so no route can forget its check, and handlers
//! narrow what they read and change to [`Principal::scope`].
//!
//! | role        | reads                          | changes                                   |
//! |-------------|--------------------------------|-------------------------------------------|
//! | `viewer`    | its tenant's objects, the fleet | nothing                                  |
//! | `developer` | as viewer                      | its tenant's models, deployments, jobs     |
//! | `operator`  | as viewer, and join tokens     | as developer, and devices, nodes, join tokens |
//! | `admin`     | everything, every tenant       | everything: tenants' tokens, grid feeds     |
//!
//! The fleet (devices, regions, nodes) is shared inventory, readable by every role;
//! models, deployments and jobs belong to a tenant.

use serde::Serialize;

pub use nephele_api::Role;

/// What a role may do at most.
pub fn grants(role: Role) -> Access {
    match role {
        Role::Viewer => Access::Read,
        Role::Developer => Access::Write,
        Role::Operator => Access::Fleet,
        Role::Admin => Access::Admin,
    }
}

/// What a request needs, least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Reads of the tenant's objects and of the fleet.
    Read,
    /// Changes to the tenant's models, deployments, rollouts and jobs.
    Write,
    /// Fleet operations: join tokens, deleting devices, draining nodes.
    Fleet,
    /// Across tenants: API tokens, the audit log, grid feeds.
    Admin,
}

impl Access {
    /// The least role that has it.
    pub fn least_role(self) -> Role {
        match self {
            Access::Read => Role::Viewer,
            Access::Write => Role::Developer,
            Access::Fleet => Role::Operator,
            Access::Admin => Role::Admin,
        }
    }
}

/// What `method path` (a `/v1` route, without its query) needs.
pub fn required(method: &str, path: &str) -> Access {
    let segments: Vec<&str> = path
        .trim_start_matches("/v1/")
        .trim_end_matches('/')
        .split('/')
        .collect();
    let read = matches!(method, "GET" | "HEAD");
    match segments.as_slice() {
        ["api-tokens", ..] | ["audit", ..] => Access::Admin,
        ["tenants", ..] if !read => Access::Admin,
        ["regions", _, "grid"] if !read => Access::Admin,
        // Join tokens enrol devices into the fleet; listing them shows what is open.
        ["tokens", ..] => Access::Fleet,
        ["devices", ..] | ["regions", ..] if !read => Access::Fleet,
        _ if read => Access::Read,
        _ => Access::Write,
    }
}

/// Who an API token speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The token's id (its public half), for the audit log and rate limits.
    pub token: String,
    pub role: Role,
    pub tenant: String,
}

impl Principal {
    /// Admins act for every tenant; other roles only for their own.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The tenant whose objects this token sees, or `None` for every tenant (admins).
    pub fn scope(&self) -> Option<&str> {
        (!self.is_admin()).then_some(self.tenant.as_str())
    }

    /// Whether it may do what `access` needs; if not, what to tell it.
    pub fn check(&self, access: Access, method: &str, path: &str) -> Result<(), String> {
        if grants(self.role) >= access {
            return Ok(());
        }
        Err(format!(
            "{method} {path} needs the {} role or above; this token (id {}) is a {} of tenant {}",
            access.least_role(),
            self.token,
            self.role,
            self.tenant
        ))
    }

    /// Shown in rollout histories and the audit log.
    pub fn describe(&self) -> String {
        format!(
            "token {} ({} of tenant {})",
            self.token, self.role, self.tenant
        )
    }
}

/// Whether an object of `owner` is visible to `scope` (see [`Principal::scope`]).
pub fn visible(scope: Option<&str>, owner: &str) -> bool {
    scope.is_none_or(|tenant| tenant == owner)
}

/// A GPU node's view as tenant `tenant` may see it: the node (shared capacity) in full,
/// the jobs on it only where they are the tenant's (`tenant/name`), the serving replicas
/// only of `deployments`, the tenant's own.
pub fn scope_node_view(
    node: &mut nephele_api::NodeView,
    tenant: &str,
    deployments: &std::collections::HashSet<String>,
) {
    let replica_of = |job: &str| -> bool {
        job.strip_prefix("serving/")
            .and_then(|replica| replica.rsplit_once('-'))
            .is_some_and(|(deployment, _)| deployments.contains(deployment))
    };
    node.jobs.retain(|job| {
        job.strip_prefix(tenant)
            .is_some_and(|rest| rest.starts_with('/'))
            || replica_of(job)
    });
    node.replicas.retain(|d| deployments.contains(d));
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    #[test]
    fn a_tenant_sees_a_node_with_only_its_own_jobs_and_replicas() {
        let mut node: nephele_api::NodeView = serde_json::from_value(serde_json::json!({
            "name": "l4-0", "pool": "l4", "profile": "gpu-4x-l4", "phase": "up",
            "agent": null, "up": true, "provider": "none",
            "device": null, "since_unix": null, "note": null,
            "replicas": ["digits", "their-llm"],
            "capacity_type": "on-demand", "price_per_hour": 1.0,
            "cpu_milli": 1, "cpu_free_milli": 1, "memory_mib": 1, "memory_free_mib": 1,
            "gpu_model": null, "gpu_free_milli": [], "mig_free": [],
            "jobs": ["team-a/train", "default/finetune", "team-ab/x",
                     "serving/digits-0", "serving/their-llm-1"]
        }))
        .expect("a node view");
        let ours = std::collections::HashSet::from(["digits".to_string()]);
        scope_node_view(&mut node, "team-a", &ours);
        assert_eq!(node.jobs, ["team-a/train", "serving/digits-0"]);
        assert_eq!(node.replicas, ["digits"]);
        assert_eq!(node.name, "l4-0");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(role: Role) -> Principal {
        Principal {
            token: "abc".into(),
            role,
            tenant: "team-a".into(),
        }
    }

    #[test]
    fn every_route_needs_what_its_table_says() {
        let cases = [
            ("GET", "/v1/models", Access::Read),
            ("PUT", "/v1/models/m", Access::Write),
            ("POST", "/v1/deployments", Access::Write),
            ("POST", "/v1/deployments/d/rollout/pause", Access::Write),
            ("DELETE", "/v1/jobs/j", Access::Write),
            ("GET", "/v1/devices", Access::Read),
            ("DELETE", "/v1/devices/edge-1", Access::Fleet),
            ("GET", "/v1/tokens", Access::Fleet),
            ("POST", "/v1/tokens", Access::Fleet),
            ("POST", "/v1/regions/r/nodes/n/drain", Access::Fleet),
            ("POST", "/v1/regions/r/nodes/n/interrupt", Access::Fleet),
            ("GET", "/v1/regions/r/grid", Access::Read),
            ("PUT", "/v1/regions/r/grid", Access::Admin),
            ("GET", "/v1/api-tokens", Access::Admin),
            ("POST", "/v1/api-tokens/x/rotate", Access::Admin),
            ("GET", "/v1/audit", Access::Admin),
            ("GET", "/v1/tenants", Access::Read),
        ];
        for (method, path, access) in cases {
            assert_eq!(required(method, path), access, "{method} {path}");
        }
    }

    #[test]
    fn roles_are_ordered_and_each_gets_exactly_its_accesses() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Ok(role));
            for access in [Access::Read, Access::Write, Access::Fleet, Access::Admin] {
                let allowed = principal(role).check(access, "GET", "/v1/x").is_ok();
                assert_eq!(allowed, role >= access.least_role(), "{role} {access:?}");
            }
        }
        let refused = principal(Role::Viewer)
            .check(Access::Write, "PUT", "/v1/models/m")
            .unwrap_err();
        assert!(refused.contains("developer role or above"), "{refused}");
        assert!(Role::parse("root").is_err());
    }

    #[test]
    fn only_admins_see_every_tenant() {
        assert_eq!(principal(Role::Operator).scope(), Some("team-a"));
        assert_eq!(principal(Role::Admin).scope(), None);
        assert!(visible(None, "team-b"));
        assert!(visible(Some("team-a"), "team-a"));
        assert!(!visible(Some("team-a"), "team-b"));
    }
}
