//! API tokens and the audit log in the core: tokens are stored as hashes only, a
//! revoked, expired or rotated-away secret stops working, the last admin cannot lock
//! everyone out, and the audit log keeps the newest entries in order.

use std::collections::HashMap;

use super::*;
use crate::config::{CloudConfig, TenantConfig};
use crate::federation::authority::NoKeys;
use crate::federation::fleet_core::{Effect, RegionNote};
use crate::federation::fleet_store::Snapshot;

fn core() -> FleetCore {
    let mut config = CloudConfig::default();
    for name in ["team-a", "team-b"] {
        config.tenants.push(TenantConfig {
            name: name.into(),
            weight: 1.0,
            quota_cpu_milli: None,
            quota_memory_mib: None,
            quota_gpu_milli: (name == "team-b").then_some(2000),
            quota_jobs: None,
            quota_replicas: None,
        });
    }
    FleetCore::new(
        config,
        Box::new(NoKeys),
        Snapshot::default(),
        1,
        HashMap::new(),
    )
}

/// Applies an output's writes as the shell does after a commit.
fn done<R>(output: Output<R>) -> R {
    output.reply
}

fn admin(core: &mut FleetCore) -> (String, Principal) {
    let token = done(core.bootstrap_admin_token(10, "adm".into(), "s".repeat(40))).unwrap();
    let principal = core.authenticate(&token, 10).expect("admin");
    (token, principal)
}

fn create(
    core: &mut FleetCore,
    by: &Principal,
    id: &str,
    spec: ApiTokenSpec,
) -> Result<ApiTokenView, ApiError> {
    done(core.create_api_token(
        100,
        spec,
        NewSecret {
            id: id.into(),
            secret: format!("{id}-secret"),
        },
        by,
    ))
}

fn spec(role: Role, tenant: &str, ttl_s: Option<u64>) -> ApiTokenSpec {
    ApiTokenSpec {
        name: "ci".into(),
        role,
        tenant: tenant.into(),
        ttl_s,
    }
}

#[test]
fn a_token_is_shown_once_and_stored_as_its_hash() {
    let mut core = core();
    let (_, by) = admin(&mut core);
    let view = create(
        &mut core,
        &by,
        "dev1",
        spec(Role::Developer, "team-a", None),
    )
    .unwrap();
    let token = view.token.clone().expect("shown once");
    assert_eq!(token, "dev1.dev1-secret");
    let stored = &core.records.api_tokens["dev1"];
    assert_ne!(stored.sha256, token);
    assert!(!serde_json::to_string(stored)
        .unwrap()
        .contains("dev1-secret"));
    assert!(core.api_token_views(100).iter().all(|v| v.token.is_none()));
    let principal = core.authenticate(&token, 100).expect("works");
    assert_eq!(
        (principal.role, principal.tenant.as_str()),
        (Role::Developer, "team-a")
    );
    assert!(core.authenticate("dev1.wrong", 100).is_none());
}

#[test]
fn bad_specs_are_refused_naming_the_field() {
    let mut core = core();
    let (_, by) = admin(&mut core);
    let field = |r: Result<ApiTokenView, ApiError>| match r {
        Err(ApiError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(create(
            &mut core,
            &by,
            "x1",
            spec(Role::Viewer, "nobody", None)
        )),
        "tenant"
    );
    assert_eq!(
        field(create(
            &mut core,
            &by,
            "x2",
            spec(Role::Viewer, "team-a", Some(0))
        )),
        "ttl_s"
    );
    let mut bad_name = spec(Role::Viewer, "team-a", None);
    bad_name.name = "has space".into();
    assert_eq!(field(create(&mut core, &by, "x3", bad_name)), "name");
    assert!(core.records.api_tokens.len() == 1, "nothing written");
}

#[test]
fn revoked_expired_and_rotated_away_secrets_stop_working() {
    let mut core = core();
    let (admin_token, by) = admin(&mut core);
    let short = create(
        &mut core,
        &by,
        "tmp1",
        spec(Role::Viewer, "team-a", Some(60)),
    )
    .unwrap();
    let short = short.token.unwrap();
    assert!(core.authenticate(&short, 159).is_some());
    assert!(core.authenticate(&short, 160).is_none());
    assert!(core.why_refused(&short, 160).contains("expired"));

    let rotated = done(core.rotate_api_token(200, "tmp1", "fresh".into(), &by)).unwrap();
    let fresh = rotated.token.unwrap();
    assert!(
        core.authenticate(&short, 200).is_none(),
        "the old secret is gone"
    );
    assert!(
        core.authenticate(&fresh, 259).is_some(),
        "a fresh life of 60 s"
    );
    assert!(core.authenticate(&fresh, 260).is_none());

    let viewer = create(&mut core, &by, "v1", spec(Role::Viewer, "team-b", None)).unwrap();
    let viewer = viewer.token.unwrap();
    done(core.revoke_api_token(300, "v1", &by)).unwrap();
    assert!(core.authenticate(&viewer, 300).is_none());
    assert!(core.why_refused(&viewer, 300).contains("revoked"));
    // A wrong secret for a revoked id says nothing about the id.
    assert_eq!(core.why_refused("v1.guess", 300), "invalid API token");
    assert!(matches!(
        done(core.revoke_api_token(301, "v1", &by)),
        Err(ApiError::Conflict(_))
    ));
    // The last admin cannot be revoked; with a second one it can.
    assert!(matches!(
        done(core.revoke_api_token(302, "adm", &by)),
        Err(ApiError::Conflict(ref m)) if m.contains("last active admin")
    ));
    create(&mut core, &by, "adm2", spec(Role::Admin, "team-a", None)).unwrap();
    done(core.revoke_api_token(303, "adm", &by)).unwrap();
    assert!(core.authenticate(&admin_token, 303).is_none());
    let states: Vec<(String, String)> = core
        .api_token_views(303)
        .into_iter()
        .map(|v| (v.id, v.state))
        .collect();
    assert!(states.contains(&("v1".into(), "revoked".into())));
    assert!(states.contains(&("adm2".into(), "active".into())));
}

#[test]
fn the_audit_log_keeps_the_newest_entries_in_order() {
    let mut core = core();
    let (_, by) = admin(&mut core);
    for i in 0..(AUDIT_KEPT + 5) {
        let output = core.record_audit(AuditEntry {
            unix_ms: i as u64,
            principal: Some(by.clone()),
            method: "POST".into(),
            path: format!("/v1/jobs/{i}"),
            status: 201,
            peer: "127.0.0.1".into(),
        });
        assert!(!output.persist.is_empty());
    }
    assert_eq!(core.records.audit.len(), AUDIT_KEPT);
    let newest = core.audit_views(0, 3, None);
    let seqs: Vec<u64> = newest.iter().map(|r| r.seq).collect();
    let last = (AUDIT_KEPT + 5) as u64;
    assert_eq!(seqs, vec![last - 2, last - 1, last]);
    assert_eq!(newest[2].token, "adm");
    assert!(core.audit_views(last, 10, None).is_empty());
    assert!(core.audit_views(0, 10, Some("team-a")).is_empty());
}

#[test]
fn model_and_deployment_names_belong_to_their_tenant() {
    let mut core = core();
    core.catalog.put_model({
        let mut m = crate::federation::fleet::tests::model("m");
        m.tenant = "team-a".into();
        m
    });
    assert!(core.check_model_owner("m", "team-a").is_ok());
    assert!(matches!(
        core.check_model_owner("m", "team-b"),
        Err(ApiError::Conflict(_))
    ));
    assert_eq!(core.model_views_for(Some("team-b")).len(), 0);
    assert_eq!(core.model_views_for(Some("team-a")).len(), 1);
    assert!(core.model_view_for("m", Some("team-b")).is_err());
    // Another tenant cannot deploy it: not found, as if it did not exist.
    let spec = crate::federation::fleet::tests::spec("d", "m", "", "auto");
    assert!(matches!(
        done(core.create_deployment(1, spec.clone(), "team-b")),
        Err(ApiError::NotFound(_))
    ));
    done(core.create_deployment(1, spec, "team-a")).unwrap();
    assert!(core.owned_deployment("d", Some("team-a")).is_ok());
    assert!(core.owned_deployment("d", None).is_ok());
    assert!(matches!(
        core.owned_deployment("d", Some("team-b")),
        Err(ApiError::NotFound(_))
    ));
    assert_eq!(core.deployment_statuses_for(Some("team-b"), true).len(), 0);
    let tenants = core.tenant_views(Some("team-a"));
    assert_eq!(tenants.len(), 1);
    assert_eq!((tenants[0].models, tenants[0].deployments), (1, 1));
    assert_eq!(core.tenant_views(None).len(), 2);
}

#[test]
fn a_command_says_what_it_changed_for_watches_deletes_included() {
    let mut core = core();
    core.catalog.put_model({
        let mut m = crate::federation::fleet::tests::model("m");
        m.tenant = "team-a".into();
        m
    });
    let spec = crate::federation::fleet::tests::spec("d", "m", "", "auto");
    done(core.create_deployment(1, spec, "team-a")).unwrap();
    let created = core.watched_changes();
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(
        (
            created[0].kind,
            created[0].name.as_str(),
            created[0].action,
            created[0].tenant.as_deref()
        ),
        (crate::watch::Kind::Deployment, "d", "put", Some("team-a"))
    );
    done(core.delete_deployment("d")).unwrap();
    let deleted = core.watched_changes();
    assert_eq!(
        (deleted[0].action, deleted[0].tenant.as_deref()),
        ("delete", Some("team-a")),
        "a delete still names its tenant"
    );
    // Changes to records watches do not follow are not listed.
    done(core.record_audit(AuditEntry {
        unix_ms: 1,
        principal: None,
        method: "POST".into(),
        path: "/v1/x".into(),
        status: 200,
        peer: "127.0.0.1".into(),
    }));
    assert!(core.watched_changes().is_empty());
}

#[test]
fn tenants_are_created_changed_and_deleted_through_the_api_and_regions_are_told() {
    let mut core = core();
    let (_, by) = admin(&mut core);
    let mut spec = TenantConfig::named("team-c");
    spec.quota_gpu_milli = Some(4000);
    let output = core.put_tenant(5, "team-c", spec.clone(), &by);
    let told = output
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Region(RegionNote::Tenant { tenant, removed: false }) if tenant.name == "team-c"));
    assert!(told, "the regions are told");
    assert_eq!(output.persist.len(), 1);
    let (created, view) = output.reply.unwrap();
    assert!(created);
    assert_eq!(view.quota_gpu_milli, Some(4000));
    assert!(!view.declared_in_config);
    // The same again changes nothing; another quota is a change.
    let again = core.put_tenant(6, "team-c", spec.clone(), &by);
    assert!(again.persist.is_empty() && again.effects.is_empty());
    assert!(!again.reply.unwrap().0);
    spec.quota_jobs = Some(3);
    let (created, view) = done(core.put_tenant(7, "team-c", spec.clone(), &by)).unwrap();
    assert!(!created);
    assert_eq!(
        (view.quota_jobs, view.created_unix, view.updated_unix),
        (Some(3), 5, 7)
    );
    // Tokens may now be made for it; it may not be deleted while one is active.
    create(
        &mut core,
        &by,
        "cdev",
        ApiTokenSpec {
            name: "c".into(),
            role: Role::Developer,
            tenant: "team-c".into(),
            ttl_s: None,
        },
    )
    .unwrap();
    assert!(matches!(
        done(core.delete_tenant("team-c", &by)),
        Err(ApiError::Conflict(m)) if m.contains("1 API token")
    ));
    done(core.revoke_api_token(8, "cdev", &by)).unwrap();
    let deleted = core.delete_tenant("team-c", &by);
    assert!(deleted
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Region(RegionNote::Tenant { removed: true, .. }))));
    deleted.reply.unwrap();
    assert!(core.tenant("team-c", None).is_err());
    // A tenant the config declares comes back at each start: refused.
    assert!(matches!(
        done(core.delete_tenant("team-a", &by)),
        Err(ApiError::Conflict(m)) if m.contains("config")
    ));
    // Bad values name the field; the path and the body agree on the name.
    let mut bad = TenantConfig::named("team-d");
    bad.weight = 0.0;
    assert!(matches!(
        done(core.put_tenant(9, "team-d", bad, &by)),
        Err(ApiError::Invalid { field, .. }) if field == "weight"
    ));
    assert!(matches!(
        done(core.put_tenant(9, "serving", TenantConfig::named("serving"), &by)),
        Err(ApiError::Invalid { field, .. }) if field == "name"
    ));
}

#[test]
fn a_tenants_deployments_may_not_ask_for_more_replicas_than_its_quota() {
    let mut core = core();
    let (_, by) = admin(&mut core);
    core.catalog.put_model({
        let mut m = crate::federation::fleet::tests::model("m");
        m.tenant = "team-a".into();
        m
    });
    let mut spec = TenantConfig::named("team-a");
    spec.quota_replicas = Some(3);
    done(core.put_tenant(5, "team-a", spec, &by)).unwrap();
    let mut first = crate::federation::fleet::tests::spec("d1", "m", "", "auto");
    first.replicas.max = Some(2);
    done(core.create_deployment(1, first, "team-a")).unwrap();
    let mut second = crate::federation::fleet::tests::spec("d2", "m", "", "auto");
    second.replicas.max = Some(2);
    assert!(matches!(
        done(core.create_deployment(1, second.clone(), "team-a")),
        Err(ApiError::Invalid { field, message }) if field == "replicas.max" && message.contains("quota of 3")
    ));
    // One that does not offload asks for none.
    second.offload = false;
    done(core.create_deployment(1, second, "team-a")).unwrap();
    // A quota under what is asked already is refused, saying how much is asked.
    let mut lower = TenantConfig::named("team-a");
    lower.quota_replicas = Some(1);
    assert!(matches!(
        done(core.put_tenant(6, "team-a", lower, &by)),
        Err(ApiError::Invalid { field, message }) if field == "quota_replicas" && message.contains("2 replicas")
    ));
}

#[test]
fn a_break_glass_token_is_an_admin_beside_the_others_and_is_audited() {
    let mut core = FleetCore::new(
        crate::config::CloudConfig::default(),
        Box::new(NoKeys),
        Default::default(),
        0,
        std::collections::HashMap::new(),
    );
    let first = core.bootstrap_admin_token(1, "first000".into(), "a".repeat(40));
    let first = first.reply.expect("bootstrap");
    let output = core.break_glass_admin_token(5, "glass000".into(), "b".repeat(40));
    assert_eq!(output.persist.len(), 2, "the token and its audit entry");
    let token = output.reply;
    let who = core.authenticate(&token, 6).expect("an active token");
    assert_eq!(who.role, Role::Admin);
    assert!(
        core.authenticate(&first, 6).is_some(),
        "the others are left alone"
    );
    let audit = core.audit_views(0, 10, None);
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].path, "/break-glass/admin-token");
    assert_eq!(audit[0].peer, "local");
}
