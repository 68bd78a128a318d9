//! The federation core driven as its shell drives it, over a [`MemoryStore`] that can
//! refuse writes: real CA, real CSRs, real manifests; no actor, no network, no clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use nephele_net::{ClusterCa, PeerIdentity};
use nephele_proto::{
    CloudMessage, DesiredState, ErrorCode, Hello, JoinRequest, NodeReport, UsageRecord,
    UsageReport, PROTOCOL_VERSION,
};
use proptest::prelude::*;

use super::*;
use crate::federation::authority::Keys;
use crate::federation::fleet::tests::{model, spec};
use crate::federation::fleet_store::{FleetStore, MemoryStore, Record, Write};
use crate::federation::{ApiError, NewJoinToken};

const PROFILE: &str = include_str!("../../../../firmware-profiles/rpi5-8gb.toml");
const NAMES: [&str; 3] = ["cam-1", "cam-2", "cam-3"];
const SELECTORS: [&str; 3] = ["", "nephele.io/name=cam-1", "site=north"];

/// One CSR per device name, made once (key generation is the slow part).
fn csr(name: &str) -> Vec<u8> {
    static CSRS: OnceLock<HashMap<&'static str, Vec<u8>>> = OnceLock::new();
    CSRS.get_or_init(|| {
        NAMES
            .iter()
            .map(|n| (*n, nephele_net::pki::agent_csr(n).expect("csr").1))
            .collect()
    })[name]
        .clone()
}

fn keys() -> Box<Keys> {
    static CA: OnceLock<(String, String)> = OnceLock::new();
    let (cert, key) = CA.get_or_init(|| {
        let ca = ClusterCa::generate("test").expect("ca");
        (ca.cert_pem.clone(), ca.key_pem.clone())
    });
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    Box::new(Keys {
        ca: ClusterCa::from_pem(cert, key).expect("ca"),
        signing_key: ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key"),
    })
}

/// The shell's part, played by the test: commit, roll back, carry out.
struct Shell {
    core: FleetCore,
    store: MemoryStore,
    /// Device → (session, last desired state it was sent).
    agents: BTreeMap<String, (u64, Option<DesiredState>)>,
    /// Device → usage acknowledged up to.
    acked: HashMap<String, u64>,
    /// Per device, the usage records it has made (seq 1..=n).
    made: HashMap<String, u64>,
    /// Usage records made by every device, deleted ones included.
    made_ever: u64,
    tokens: Vec<(String, String)>,
    certs: HashMap<String, [u8; 32]>,
    now_unix: u64,
    now_ms: u64,
    next_token: u64,
    /// Commits to refuse before the store takes writes again.
    refuse_next: u32,
    /// Blobs the core asked to remove, in order.
    removed_blobs: Vec<String>,
}

impl Shell {
    fn new() -> Shell {
        // A model to deploy, stored as the model build would.
        let store = MemoryStore::default();
        store
            .commit(&[
                Write::Put(Record::Model(Box::new(model("m")))),
                Write::Put(Record::Model(Box::new(model_v2()))),
            ])
            .expect("commit");
        let config = crate::config::CloudConfig {
            heartbeat_interval_ms: 1000,
            ..Default::default()
        };
        let core = FleetCore::new(
            config,
            keys(),
            store.load().expect("load"),
            1,
            HashMap::new(),
        );
        Shell {
            core,
            store,
            agents: BTreeMap::new(),
            acked: HashMap::new(),
            made: HashMap::new(),
            made_ever: 0,
            tokens: Vec::new(),
            certs: HashMap::new(),
            now_unix: 1_000,
            now_ms: 0,
            next_token: 0,
            refuse_next: 0,
            removed_blobs: Vec::new(),
        }
    }

    /// What the actor's `run` does.
    fn run<R>(&mut self, output: Output<R>) -> Result<R, crate::store::StoreError> {
        if !output.persist.is_empty() {
            let refuse = self.refuse_next > 0;
            if refuse {
                self.refuse_next -= 1;
                self.store.refuse_writes(true);
            }
            let committed = self.store.commit(&output.persist);
            if refuse {
                self.store.refuse_writes(false);
            }
            if let Err(error) = committed {
                self.core.rollback();
                return Err(error);
            }
        }
        self.carry_out(output.effects);
        Ok(output.reply)
    }

    fn carry_out(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send {
                    device,
                    session,
                    message,
                } => {
                    let Some(agent) = self.agents.get_mut(&device).filter(|a| a.0 == session)
                    else {
                        continue;
                    };
                    match message {
                        CloudMessage::DesiredState(desired) => agent.1 = Some(desired),
                        CloudMessage::UsageAck { up_to } => {
                            self.acked.insert(device, up_to);
                        }
                        CloudMessage::Refused(_) => {}
                        other => panic!("unexpected message {other:?}"),
                    }
                }
                Effect::Register { device, session } => {
                    self.agents.insert(device, (session, None));
                }
                Effect::EndSession { device, session } => {
                    if self.agents.get(&device).map(|a| a.0) == Some(session) {
                        self.agents.remove(&device);
                    }
                }
                Effect::Region(_) => {}
                Effect::DeleteBlobs { sha256s } => self.removed_blobs.extend(sha256s),
            }
        }
    }

    fn token(&mut self) -> Result<(), ApiError> {
        self.next_token += 1;
        let new = NewJoinToken {
            region: None,
            ttl_s: Some(60),
            id: format!("t{}", self.next_token),
            secret: format!("secret{}", self.next_token),
        };
        let (id, secret) = (new.id.clone(), new.secret.clone());
        let output = self.core.create_join_token(self.now_unix, new);
        self.run(output)??;
        self.tokens.push((id, secret));
        Ok(())
    }

    fn join(&mut self, token: usize, name: &str) -> Result<(), String> {
        let Some((id, secret)) = self.tokens.get(token).cloned() else {
            return Err("no token".into());
        };
        let mut labels = BTreeMap::new();
        labels.insert("site".to_string(), "north".to_string());
        let request = JoinRequest {
            protocol_version: PROTOCOL_VERSION,
            token_id: id,
            token_secret: secret,
            name: name.into(),
            role: "edge".into(),
            csr_der: csr(name),
            labels,
        };
        let output = self.core.join(self.now_unix, request);
        let accepted = self
            .run(output)
            .map_err(|e| e.to_string())?
            .map_err(|e| e.message)?;
        self.certs.insert(
            name.to_string(),
            nephele_net::fingerprint(&accepted.certificate_der),
        );
        Ok(())
    }

    fn connect(&mut self, name: &str) -> Result<u64, String> {
        let identity = PeerIdentity {
            name: name.into(),
            role: "edge".into(),
            cert_sha256: self.certs.get(name).copied().unwrap_or([0; 32]),
        };
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: "test".into(),
            role: "edge".into(),
            profile_name: "rpi5-8gb".into(),
            profile_toml: PROFILE.into(),
            models_cached: vec![],
            local_endpoint: "127.0.0.1:8700".into(),
            node: NodeReport::default(),
            jobs: vec![],
        };
        let output = self.core.agent_connected(self.now_ms, &identity, hello);
        let (session, _, desired) = self
            .run(output)
            .map_err(|e| e.to_string())?
            .map_err(|e| e.message)?;
        // The gateway sends the desired state of the reply first.
        if let Some(agent) = self.agents.get_mut(name) {
            agent.1 = Some(desired);
        }
        Ok(session)
    }

    fn disconnect(&mut self, name: &str) {
        if let Some(&(session, _)) = self.agents.get(name) {
            let effects = self.core.disconnected(name, session, "test");
            self.carry_out(effects);
        }
    }

    /// The agent sends every record not acknowledged yet, after making `new` more.
    fn usage(&mut self, name: &str, new: u64) {
        let Some(&(session, _)) = self.agents.get(name) else {
            return;
        };
        let made = self.made.entry(name.to_string()).or_default();
        *made += new;
        self.made_ever += new;
        let from = self.acked.get(name).copied().unwrap_or(0) + 1;
        let records = (from..=*made)
            .map(|seq| UsageRecord {
                seq,
                start_unix_ms: seq,
                end_unix_ms: seq + 1,
                deployment: "d".into(),
                served_local: 1,
                served_offloaded: 0,
                failed: 0,
            })
            .collect();
        let report = UsageReport {
            records,
            dropped: 0,
        };
        let output = self.core.usage(name, session, &report);
        let _ = self.run(output);
    }

    fn delete(&mut self, name: &str) {
        let output = self.core.delete_device(name);
        if let Ok(Ok(())) = self.run(output) {
            self.made.remove(name);
            self.acked.remove(name);
            self.certs.remove(name);
        }
    }

    fn deploy(&mut self, name: &str, selector: &str) {
        let output = self.core.create_deployment(
            self.now_unix,
            spec(name, "m", selector, "auto"),
            "default",
        );
        let _ = self.run(output);
    }

    /// Updates deployment `name` to model `model`, rolled out in two steps judged on
    /// no traffic at all (so only readiness and the deadline decide).
    fn update(&mut self, name: &str, model: &str) {
        let mut spec = spec(name, model, "", "auto");
        spec.rollout = Some(quick_rollout());
        let output = self.core.update_deployment(self.now_ms, name, spec);
        let _ = self.run(output);
    }

    fn tick_rollouts(&mut self) {
        let output = self.core.tick_rollouts(self.now_ms);
        let _ = self.run(output);
    }

    fn act(&mut self, name: &str, action: RolloutAction) {
        let output = self.core.rollout_action(self.now_ms, name, action, "test");
        let _ = self.run(output);
    }

    /// A heartbeat of `name` saying it runs deployment `d` on the bytes `sha` with
    /// `requests` served and a p99 of `p99_ms`.
    fn report(&mut self, name: &str, d: &str, sha: [u8; 32], requests: u64, p99_ms: u64) {
        let Some(&(session, _)) = self.agents.get(name) else {
            return;
        };
        let mut row =
            nephele_proto::DeploymentTelemetry::idle(d, nephele_proto::DeploymentPhase::Ready);
        row.served_local = requests;
        row.p99_us = p99_ms * 1000;
        row.variant = "full".into();
        row.model_sha256 = sha;
        let heartbeat = nephele_proto::Heartbeat {
            seq: 1,
            uptime_ms: self.now_ms,
            applied_generation: 0,
            rss_bytes: 0,
            deployments: vec![row],
            link: Default::default(),
            jobs: vec![],
        };
        let effects = self.core.heartbeat(self.now_ms, name, session, heartbeat);
        self.carry_out(effects);
    }

    /// The variant digest device `name` was last sent for deployment `d`.
    fn sent_digest(&self, name: &str, d: &str) -> Option<[u8; 32]> {
        let desired = self.agents.get(name)?.1.as_ref()?;
        let assignment = desired.assignments.iter().find(|a| a.deployment == d)?;
        let manifest: nephele_proto::ModelManifest =
            nephele_proto::decode_payload(&assignment.model.manifest).ok()?;
        manifest
            .variants
            .iter()
            .find(|v| v.name == assignment.variant)
            .map(|v| v.sha256)
    }

    fn undeploy(&mut self, name: &str) {
        let output = self.core.delete_deployment(name);
        let _ = self.run(output);
    }

    /// The core's mirror is exactly what the store holds.
    fn check_mirror(&self) {
        let fresh = FleetCore::new(
            self.core.config.clone(),
            keys(),
            self.store.load().expect("load"),
            1,
            HashMap::new(),
        );
        let json = |v: &dyn erased::Json| v.json();
        assert_eq!(
            json(&self.core.records.devices),
            json(&fresh.records.devices),
            "devices"
        );
        assert_eq!(
            json(&self.core.records.join_tokens),
            json(&fresh.records.join_tokens),
            "join tokens"
        );
        assert_eq!(
            json(&self.core.records.usage),
            json(&fresh.records.usage),
            "usage"
        );
        assert_eq!(
            json(&self.core.records.usage_hours),
            json(&fresh.records.usage_hours),
            "usage per deployment and hour"
        );
        assert_eq!(
            self.core.profiles.written(),
            fresh.profiles.written(),
            "capabilities and hardware worked out from profiles"
        );
        assert_eq!(
            self.core.profiles.distinct(),
            fresh.profiles.distinct(),
            "profiles no device announces are forgotten"
        );
        let names = |core: &FleetCore| {
            core.catalog
                .deployments()
                .map(|d| serde_json::to_string(d).expect("json"))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&self.core), names(&fresh), "deployments");
    }

    /// Every connected agent was last sent what it should run now, and the shell's
    /// sessions are the core's.
    fn check_sessions_and_desired(&self) {
        let core_sessions: BTreeMap<&String, u64> = self
            .core
            .sessions()
            .iter()
            .map(|(name, s)| (name, s.id))
            .collect();
        let shell_sessions: BTreeMap<&String, u64> =
            self.agents.iter().map(|(name, a)| (name, a.0)).collect();
        assert_eq!(core_sessions, shell_sessions);
        for (name, (_, sent)) in &self.agents {
            let device = &self.core.records.devices[name];
            let now = self.core.desired_for(device);
            let sent = sent.as_ref().expect("a connected agent was sent a state");
            assert_eq!(sent.assignments, now.assignments, "{name}");
        }
    }

    /// Each usage record acknowledged was counted exactly once, in the device's totals
    /// and in its deployment's hours alike.
    fn check_usage(&self) {
        let per_hour: u64 = self
            .core
            .records
            .usage_hours
            .values()
            .map(|h| h.served.served_local)
            .sum();
        // A deleted device's totals go with it; its hours stay (they are the books).
        let per_device: u64 = self.core.records.usage.values().map(|t| t.last_seq).sum();
        let made = self.made_ever;
        assert!(
            per_device <= per_hour && per_hour <= made,
            "served per hour {per_hour}, per device {per_device}, made {made}"
        );
        for (name, totals) in &self.core.records.usage {
            let served: u64 = totals.deployments.values().map(|s| s.served_local).sum();
            assert_eq!(totals.records, totals.last_seq, "{name}");
            assert_eq!(served, totals.last_seq, "{name}");
            if let Some(&acked) = self.acked.get(name) {
                assert!(
                    acked <= totals.last_seq,
                    "{name}: acked beyond what is stored"
                );
            }
        }
    }
}

mod erased {
    /// Serialises any map of records, to compare a mirror with a fresh load.
    pub trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).expect("json")
        }
    }
}

#[test]
fn a_join_token_enrols_one_device_once_and_expires() {
    let mut shell = Shell::new();
    shell.token().unwrap();
    shell.join(0, "cam-1").unwrap();
    let again = shell.join(0, "cam-2").unwrap_err();
    assert!(again.contains("already used by cam-1"), "{again}");
    shell.token().unwrap();
    shell.now_unix += 61;
    let late = shell.join(1, "cam-2").unwrap_err();
    assert!(late.contains("expired"), "{late}");
    // The token and the device were committed together.
    let records = shell.store.records();
    assert!(records.contains_key(&("devices", "cam-1".to_string())));
    match &records[&("join_tokens", "t1".to_string())] {
        Record::JoinToken(token) => assert_eq!(token.used_by.as_deref(), Some("cam-1")),
        other => panic!("{other:?}"),
    }
    shell.check_mirror();
}

#[test]
fn a_refused_commit_changes_nothing_and_sends_nothing() {
    let mut shell = Shell::new();
    shell.token().unwrap();
    shell.store.refuse_writes(true);
    let refused = shell.join(0, "cam-1").unwrap_err();
    assert!(refused.contains("refuses writes"), "{refused}");
    shell.check_mirror();
    assert!(
        shell.core.records.join_tokens["t1"].used_by.is_none(),
        "the token is not spent by a join that was not kept"
    );
    shell.store.refuse_writes(false);
    shell.join(0, "cam-1").unwrap();
    shell.connect("cam-1").unwrap();
    shell.deploy("d", "");
    shell.store.refuse_writes(true);
    let before = shell.agents["cam-1"].1.clone();
    shell.undeploy("d");
    assert_eq!(
        shell.agents["cam-1"].1, before,
        "no desired state sent for a delete that was not kept"
    );
    assert!(shell.core.deployment_status("d").is_ok());
    shell.store.refuse_writes(false);
    shell.undeploy("d");
    assert!(shell.agents["cam-1"]
        .1
        .as_ref()
        .unwrap()
        .assignments
        .is_empty());
    shell.check_mirror();
}

#[test]
fn a_reconnect_replaces_the_session_and_the_old_one_is_ignored() {
    let mut shell = Shell::new();
    shell.token().unwrap();
    shell.join(0, "cam-1").unwrap();
    let first = shell.connect("cam-1").unwrap();
    let second = shell.connect("cam-1").unwrap();
    assert_ne!(first, second);
    // The first session's end (its connection closing late) ends nothing.
    let effects = shell.core.disconnected("cam-1", first, "old");
    assert!(!effects
        .iter()
        .any(|e| matches!(e, Effect::EndSession { .. })));
    assert_eq!(shell.core.sessions()["cam-1"].id, second);
    // Usage on the old session is not counted or acknowledged.
    let output = shell.core.usage(
        "cam-1",
        first,
        &UsageReport {
            records: vec![],
            dropped: 0,
        },
    );
    assert!(output.effects.is_empty() && output.persist.is_empty());
}

#[test]
fn a_deleted_device_is_told_why_and_its_certificate_refused() {
    let mut shell = Shell::new();
    shell.token().unwrap();
    shell.join(0, "cam-1").unwrap();
    let session = shell.connect("cam-1").unwrap();
    shell.usage("cam-1", 3);
    let output = shell.core.delete_device("cam-1");
    assert!(output.effects.iter().any(|e| matches!(
        e,
        Effect::Send { message: CloudMessage::Refused(frame), session: s, .. }
            if *s == session && frame.message.contains("deleted")
    )));
    shell.run(output).unwrap().unwrap();
    assert!(!shell.agents.contains_key("cam-1"));
    assert!(!shell
        .store
        .records()
        .contains_key(&("usage", "cam-1".to_string())));
    let refused = shell.connect("cam-1").unwrap_err();
    assert!(refused.contains("not enrolled"), "{refused}");
    assert!(matches!(
        shell.core.delete_device("cam-1").reply,
        Err(ApiError::NotFound(_))
    ));
}

#[test]
fn a_wrong_certificate_is_refused() {
    let mut shell = Shell::new();
    shell.token().unwrap();
    shell.join(0, "cam-1").unwrap();
    shell.certs.insert("cam-1".into(), [9; 32]);
    let refused = shell.connect("cam-1").unwrap_err();
    assert!(refused.contains("superseded or revoked"), "{refused}");
    let output = shell.core.join(
        shell.now_unix,
        JoinRequest {
            protocol_version: PROTOCOL_VERSION + 1,
            token_id: "t1".into(),
            token_secret: "x".into(),
            name: "cam-2".into(),
            role: "edge".into(),
            csr_der: vec![],
            labels: BTreeMap::new(),
        },
    );
    assert_eq!(output.reply.unwrap_err().code, ErrorCode::VersionMismatch);
}

#[test]
fn the_first_admin_token_is_made_once_and_authenticates() {
    let mut shell = Shell::new();
    let output = shell
        .core
        .bootstrap_admin_token(1, "abc".into(), "s3cret".into());
    let token = shell.run(output).unwrap().expect("a fresh plane makes one");
    assert_eq!(token, "abc.s3cret");
    let admin = shell
        .core
        .authenticate(&token, 2)
        .expect("it authenticates");
    assert!(admin.is_admin());
    assert!(shell.core.authenticate("abc.wrong", 2).is_none());
    assert!(shell.core.authenticate("no-dot", 2).is_none());
    // Only its hash is kept.
    match &shell.store.records()[&("api_tokens", "abc".to_string())] {
        Record::ApiToken(record) => assert!(!record.sha256.contains("s3cret")),
        other => panic!("{other:?}"),
    }
    let again = shell
        .core
        .bootstrap_admin_token(2, "def".into(), "x".into());
    assert!(again.reply.is_none() && again.persist.is_empty());
}

/// A second version of model `m`, whose variants are other bytes.
fn model_v2() -> crate::store::ModelRecord {
    let mut v2 = model("m");
    v2.version = "v2".into();
    v2.created_unix = 5;
    let mut manifest: nephele_proto::ModelManifest =
        nephele_proto::decode_payload(&v2.signed_manifest).expect("manifest");
    for variant in &mut manifest.variants {
        variant.sha256 = [8; 32];
    }
    v2.signed_manifest = nephele_proto::encode_payload(&manifest).expect("encodes");
    v2
}

fn quick_rollout() -> crate::rollout::RolloutSettings {
    crate::rollout::RolloutSettings {
        steps: vec![30, 100],
        min_requests: 100,
        min_step_s: 0,
        progress_deadline_s: 1,
        ..Default::default()
    }
}

use crate::federation::RolloutAction;

impl Shell {
    /// Every device of `NAMES` enrolled and connected, deployment `d0` running the
    /// first version of `m` (`m:00`) on all of them.
    fn with_every_device_running_m00() -> Shell {
        let mut shell = Shell::new();
        for name in NAMES {
            shell.token().expect("token");
            shell.join(shell.tokens.len() - 1, name).expect("join");
            shell.connect(name).expect("connect");
        }
        let output =
            shell
                .core
                .create_deployment(shell.now_unix, spec("d0", "m:00", "", "auto"), "default");
        shell.run(output).expect("committed").expect("created");
        shell
    }
}

#[test]
fn a_slow_version_goes_to_the_canary_only_and_comes_back_from_it_alone() {
    let mut shell = Shell::with_every_device_running_m00();
    for name in NAMES {
        assert_eq!(shell.sent_digest(name, "d0"), Some([7; 32]), "{name}");
    }
    // The latest version of `m` is v2; the update names it by `name:version`.
    shell.update("d0", "m:v2");
    let canary = "cam-1";
    assert_eq!(shell.sent_digest(canary, "d0"), Some([8; 32]));
    for name in ["cam-2", "cam-3"] {
        assert_eq!(shell.sent_digest(name, "d0"), Some([7; 32]), "{name}");
    }
    let status = shell.core.deployment_status("d0").expect("status");
    let rollout = status.rollout.expect("a rollout");
    assert_eq!(rollout.moved_devices, vec![canary.to_string()]);
    assert_eq!(
        status.model, "m:00",
        "the deployment's own version until complete"
    );

    // The canary runs v2 at 40 ms, the others v1 at 1 ms: the gate fails.
    shell.now_ms += 2_000;
    shell.report(canary, "d0", [8; 32], 500, 40);
    shell.report("cam-2", "d0", [7; 32], 500, 1);
    shell.report("cam-3", "d0", [7; 32], 500, 1);
    shell.tick_rollouts();
    let status = shell.core.deployment_status("d0").expect("status");
    let rollout = status.rollout.expect("a rollout");
    assert_eq!(rollout.state, crate::rollout::RolloutState::RolledBack);
    assert!(rollout.gate.contains("p99 40.0 ms"), "{}", rollout.gate);
    for name in NAMES {
        assert_eq!(shell.sent_digest(name, "d0"), Some([7; 32]), "{name}");
    }
    shell.check_mirror();
    shell.check_sessions_and_desired();

    // The same update again, and this time v2 is as fast: every device gets it.
    shell.update("d0", "m:v2");
    for round in 0..4 {
        shell.now_ms += 2_000;
        for name in NAMES {
            let sha = shell.sent_digest(name, "d0").expect("assigned");
            shell.report(name, "d0", sha, 500 + round, 1);
        }
        shell.tick_rollouts();
    }
    let status = shell.core.deployment_status("d0").expect("status");
    assert_eq!(
        status.rollout.as_ref().map(|r| r.state),
        Some(crate::rollout::RolloutState::Complete),
        "{:?}",
        status.rollout.map(|r| r.gate)
    );
    assert_eq!(status.model, "m:v2");
    for name in NAMES {
        assert_eq!(shell.sent_digest(name, "d0"), Some([8; 32]), "{name}");
    }
    shell.check_mirror();
    shell.check_sessions_and_desired();
}

#[test]
fn an_update_during_a_rollout_is_refused_and_undo_brings_the_canary_back() {
    let mut shell = Shell::with_every_device_running_m00();
    shell.update("d0", "m:v2");
    let again = shell
        .core
        .update_deployment(shell.now_ms, "d0", spec("d0", "m:00", "", "auto"));
    assert!(matches!(again.reply, Err(ApiError::Conflict(ref m)) if m.contains("rollout undo")));
    let renamed = shell
        .core
        .update_deployment(shell.now_ms, "d0", spec("other", "m", "", "auto"));
    assert!(matches!(renamed.reply, Err(ApiError::BadRequest(ref m)) if m.starts_with("name:")));
    shell.act("d0", RolloutAction::Pause);
    shell.now_ms += 10_000;
    shell.tick_rollouts();
    let paused = shell
        .core
        .deployment_status("d0")
        .expect("status")
        .rollout
        .expect("rollout");
    assert_eq!(
        paused.state,
        crate::rollout::RolloutState::Paused,
        "past the deadline, but paused"
    );
    shell.act("d0", RolloutAction::Rollback);
    for name in NAMES {
        assert_eq!(shell.sent_digest(name, "d0"), Some([7; 32]), "{name}");
    }
    let missing =
        shell
            .core
            .update_deployment(shell.now_ms, "d0", spec("d0", "m:nope", "", "auto"));
    assert!(
        matches!(missing.reply, Err(ApiError::NotFound(ref m)) if m.contains("m:00") && m.contains("m:v2")),
        "{:?}",
        missing.reply.err()
    );
    shell.check_mirror();
    shell.check_sessions_and_desired();
}

#[derive(Debug, Clone)]
enum Step {
    Token,
    /// Join with a fresh token (`None`) or one made before.
    Join(Option<usize>, usize),
    Connect(usize),
    Disconnect(usize),
    Delete(usize),
    Deploy(usize, usize),
    Undeploy(usize),
    /// Deployment d to model version v (`m` or `m:v2`), rolled out in steps.
    Update(usize, usize),
    RolloutTick,
    Act(usize, usize),
    Usage(usize, u64),
    /// The store refuses the next this many commits (an etcd cluster without a
    /// quorum, for a while).
    StoreRefuses(u32),
}

fn step() -> impl Strategy<Value = Step> {
    // Weighted so that sequences get far: devices join, connect and report usage
    // while deployments come and go and the store now and then refuses writes.
    prop_oneof![
        1 => Just(Step::Token),
        4 => (proptest::option::weighted(0.25, 0..4usize), 0..3usize)
            .prop_map(|(t, n)| Step::Join(t, n)),
        4 => (0..3usize).prop_map(Step::Connect),
        1 => (0..3usize).prop_map(Step::Disconnect),
        1 => (0..3usize).prop_map(Step::Delete),
        3 => (0..2usize, 0..3usize).prop_map(|(d, s)| Step::Deploy(d, s)),
        1 => (0..2usize).prop_map(Step::Undeploy),
        2 => (0..2usize, 0..2usize).prop_map(|(d, v)| Step::Update(d, v)),
        3 => Just(Step::RolloutTick),
        1 => (0..2usize, 0..3usize).prop_map(|(d, a)| Step::Act(d, a)),
        4 => (0..3usize, 0..4u64).prop_map(|(n, k)| Step::Usage(n, k)),
        2 => (1..4u32).prop_map(Step::StoreRefuses),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever agents and operators do, and whenever the store refuses a write: the
    /// core holds exactly what the store holds, every connected agent was last sent
    /// what it should run now, and each acknowledged usage record was counted once.
    #[test]
    fn the_core_never_holds_or_sends_what_the_store_did_not_keep(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        play(steps);
    }
}

/// Found by the property test above (the sequence it shrank to): d0's rollout rolls
/// back on cam-2 in the same tick as d1's rollout completes. The completion's broadcast
/// replaced the tick's other sends instead of following them, and as cam-2 already
/// counted as sent, the rollback never reached it: it kept running d0's new version.
#[test]
fn a_rollback_in_the_tick_another_rollout_completes_reaches_its_devices() {
    play(vec![
        Step::Token,
        Step::Deploy(0, 0),
        Step::StoreRefuses(1),
        Step::Token,
        Step::Join(None, 1),
        Step::Connect(1),
        Step::Deploy(1, 0),
        Step::Update(1, 0),
        Step::RolloutTick,
        Step::Update(0, 0),
        Step::Connect(0),
        Step::Act(0, 1),
        Step::Deploy(0, 0),
        Step::RolloutTick,
    ]);
}

/// Plays `steps` on a fresh shell, checking the invariants after each.
fn play(steps: Vec<Step>) {
    let mut shell = Shell::new();
    for step in steps {
        shell.now_ms += 100;
        match step {
            Step::Token => {
                let _ = shell.token();
            }
            Step::Join(token, name) => {
                let token = match token {
                    Some(token) => token,
                    None => {
                        let _ = shell.token();
                        shell.tokens.len().saturating_sub(1)
                    }
                };
                let _ = shell.join(token, NAMES[name]);
            }
            Step::Connect(name) => {
                let _ = shell.connect(NAMES[name]);
            }
            Step::Disconnect(name) => shell.disconnect(NAMES[name]),
            Step::Delete(name) => shell.delete(NAMES[name]),
            Step::Deploy(d, s) => shell.deploy(["d0", "d1"][d], SELECTORS[s]),
            Step::Undeploy(d) => shell.undeploy(["d0", "d1"][d]),
            Step::Update(d, v) => shell.update(["d0", "d1"][d], ["m:00", "m"][v]),
            Step::RolloutTick => {
                // Agents report what they were sent, so rollouts move on.
                shell.now_ms += 700;
                for name in NAMES {
                    for d in ["d0", "d1"] {
                        if let Some(sha) = shell.sent_digest(name, d) {
                            shell.report(name, d, sha, shell.now_ms, 1);
                        }
                    }
                }
                shell.tick_rollouts();
            }
            Step::Act(d, a) => shell.act(
                ["d0", "d1"][d],
                [
                    RolloutAction::Pause,
                    RolloutAction::Resume,
                    RolloutAction::Rollback,
                ][a],
            ),
            Step::Usage(name, new) => shell.usage(NAMES[name], new),
            Step::StoreRefuses(commits) => shell.refuse_next = commits,
        }
        shell.check_mirror();
        shell.check_sessions_and_desired();
        shell.check_usage();
    }
}

#[test]
fn a_selector_that_matches_no_device_is_accepted_with_a_warning_and_the_count() {
    use crate::federation::fleet::tests::device;
    let store = MemoryStore::default();
    store
        .commit(&[
            Write::Put(Record::Model(Box::new(model("m")))),
            Write::Put(Record::Device(device(
                "cam-1",
                nephele_domain::AgentRole::Edge,
                &[("site", "north")],
            ))),
        ])
        .expect("commit");
    let mut core = FleetCore::new(
        crate::config::CloudConfig::default(),
        keys(),
        store.load().expect("load"),
        1,
        HashMap::new(),
    );
    let none = core
        .create_deployment(1, spec("d1", "m", "site=south", "auto"), "default")
        .reply
        .expect("accepted");
    assert_eq!(none.desired_devices, 0);
    assert_eq!(none.warnings.len(), 1, "{:?}", none.warnings);
    assert!(
        none.warnings[0].contains("\"site=south\" matches none of the 1 enrolled edge devices"),
        "{:?}",
        none.warnings
    );
    let some = core
        .create_deployment(1, spec("d2", "m", "site=north", "auto"), "default")
        .reply
        .expect("accepted");
    assert_eq!(some.desired_devices, 1);
    assert!(some.warnings.is_empty(), "{:?}", some.warnings);
    // No selector: every device, said so.
    let every = core
        .create_deployment(1, spec("d3", "m", "", "auto"), "default")
        .reply
        .expect("accepted");
    assert_eq!(every.desired_devices, 1);
    assert!(
        every.warnings.len() == 1 && every.warnings[0].contains("runs on every edge device (1 now"),
        "{:?}",
        every.warnings
    );
}

/// A new deployment sends its desired state to the devices it selects and to no other:
/// what a change leaves as it was costs a device no message (at 50,000 agents, every
/// deployment went to all of them).
#[test]
fn a_change_sends_a_desired_state_only_to_the_devices_whose_state_it_changed() {
    let mut shell = Shell::new();
    for name in ["cam-1", "cam-2"] {
        shell.token().expect("token");
        shell.join(shell.tokens.len() - 1, name).expect("join");
        shell.connect(name).expect("connect");
    }
    let sent_to = |shell: &mut Shell, name: &str, selector: &str| -> Vec<String> {
        let output = shell.core.create_deployment(
            shell.now_unix,
            spec(name, "m", selector, "auto"),
            "default",
        );
        let told: Vec<String> = output
            .effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Send {
                    device,
                    message: CloudMessage::DesiredState(_),
                    ..
                } => Some(device.clone()),
                _ => None,
            })
            .collect();
        shell.run(output).expect("committed").expect("accepted");
        told
    };
    assert_eq!(
        sent_to(&mut shell, "d1", "nephele.io/name=cam-1"),
        ["cam-1"]
    );
    assert!(sent_to(&mut shell, "d2", "site=south").is_empty());
    assert_eq!(sent_to(&mut shell, "d3", "site=north"), ["cam-1", "cam-2"]);
    // A reconnect starts a new session from the state its welcome carried; changes
    // still reach the device after it.
    shell.disconnect("cam-2");
    shell.connect("cam-2").expect("reconnect");
    assert_eq!(
        sent_to(&mut shell, "d4", "nephele.io/name=cam-2"),
        ["cam-2"]
    );
    shell.check_sessions_and_desired();
}

/// A deployment's status counts its edge devices by phase (a disconnected one as
/// offline, whatever it last said), with or without a row per device, and the counts
/// agree with the rows.
#[test]
fn a_status_counts_its_devices_by_phase_with_or_without_rows() {
    let mut shell = Shell::new();
    for name in ["cam-1", "cam-2", "cam-3"] {
        shell.token().expect("token");
        shell.join(shell.tokens.len() - 1, name).expect("join");
        shell.connect(name).expect("connect");
    }
    shell.deploy("d", "site=north");
    for (name, requests, p99_ms) in [("cam-1", 7, 3), ("cam-2", 5, 9)] {
        let sha = shell.sent_digest(name, "d").expect("told what to run");
        shell.report(name, "d", sha, requests, p99_ms);
    }
    shell.disconnect("cam-2");
    let full = shell
        .core
        .deployment_status_with("d", true)
        .expect("status");
    let counts = shell
        .core
        .deployment_status_with("d", false)
        .expect("status");
    let phases = |pairs: &[(&str, usize)]| {
        Some(
            pairs
                .iter()
                .map(|(phase, n)| (phase.to_string(), *n))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let want = phases(&[("offline", 1), ("pending", 1), ("ready", 1)]);
    assert_eq!(full.device_phases, want);
    assert_eq!((full.desired_devices, full.ready_devices), (3, Some(1)));
    assert_eq!(full.devices.len(), 3);
    assert!(counts.devices.is_empty());
    assert_eq!(
        nephele_api::DeploymentStatus {
            devices: Vec::new(),
            ..full.clone()
        },
        counts,
        "the counts alone are the full status without its rows"
    );
    let ready_rows = full
        .devices
        .iter()
        .filter(|r| r.ready == Some(true))
        .count();
    assert_eq!(Some(ready_rows), full.ready_devices);
    // The totals are the rows summed: what a fleet's dashboard shows without rows.
    let totals = full.totals.expect("the leader knows its totals");
    let sum = |f: fn(&nephele_api::DeviceDeploymentStatus) -> Option<u64>| {
        full.devices.iter().filter_map(f).sum::<u64>()
    };
    assert_eq!(totals.served_local, sum(|r| r.served_local));
    assert_eq!(totals.served_local, 12);
    assert_eq!(totals.served_offloaded, sum(|r| r.served_offloaded));
    assert_eq!(totals.failed, sum(|r| r.failed));
    assert_eq!(totals.worst_p99_ms, 9.0);
    assert_eq!(totals.variants, BTreeMap::from([("full".to_string(), 2)]));
}

#[test]
fn a_page_of_devices_is_built_from_its_cursor_and_regions_count_devices_by_health() {
    let mut shell = Shell::new();
    for name in NAMES {
        shell.token().expect("token");
        shell.join(shell.tokens.len() - 1, name).expect("join");
        shell.connect(name).expect("connect");
    }
    shell.deploy("d", "site=north");
    shell.disconnect("cam-2");
    // cam-3 says nothing for four heartbeat intervals: late, so stale.
    shell.now_ms += 4 * u64::from(shell.core.config.heartbeat_interval_ms);
    let sha = shell.sent_digest("cam-1", "d").expect("told what to run");
    shell.report("cam-1", "d", sha, 4, 2);
    let now = shell.now_ms;

    let all = shell.core.device_views(now);
    let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, NAMES);
    assert_eq!(shell.core.device_views_after(now, None, 2), all[..2]);
    assert_eq!(
        shell.core.device_views_after(now, Some("cam-2"), 10),
        all[2..]
    );
    assert_eq!(
        shell.core.device_views_after(now, Some("cam-1"), 1),
        all[1..2]
    );
    assert!(shell
        .core
        .device_views_after(now, Some("cam-3"), 10)
        .is_empty());

    let health: Vec<&str> = all.iter().map(|d| d.health.as_str()).collect();
    assert_eq!(health, ["healthy", "offline", "stale"]);
    let regions = shell.core.region_views(now);
    let region = regions
        .iter()
        .find(|r| r.name == all[0].region)
        .expect("the devices' region");
    assert_eq!(
        region.health,
        Some(BTreeMap::from([
            ("healthy".to_string(), 1),
            ("offline".to_string(), 1),
            ("stale".to_string(), 1),
        ]))
    );
    assert_eq!(region.online, Some(2));

    // What a device runs, from its own heartbeat.
    assert_eq!(
        all[0].running,
        Some(vec![nephele_api::DeviceRunning {
            deployment: "d".into(),
            variant: "full".into(),
            phase: "ready".into(),
            served_local: 4,
            served_offloaded: 0,
        }])
    );
    assert_eq!(all[2].running, Some(Vec::new()));
    assert_eq!(all[0].cpu_cores > 0, all[2].cpu_cores > 0);

    // Another tenant sees the device, not what `default` runs on it or served there.
    let mut theirs = all[0].clone();
    shell.core.scope_device_view(&mut theirs, Some("team-a"));
    assert_eq!(
        (theirs.running, theirs.deployments),
        (Some(Vec::new()), Some(0))
    );
    assert_eq!(theirs.name, all[0].name);
    let mut owner = all[0].clone();
    shell.core.scope_device_view(&mut owner, Some("default"));
    assert_eq!(owner, all[0]);
    shell.usage("cam-1", 2);
    let usage = shell.core.usage_for("cam-1", None).expect("usage");
    assert!(usage.deployments.contains_key("d"), "{usage:?}");
    let hidden = shell
        .core
        .usage_for("cam-1", Some("team-a"))
        .expect("usage");
    assert!(hidden.deployments.is_empty(), "{hidden:?}");
    assert_eq!(
        shell
            .core
            .usage_for("cam-1", Some("default"))
            .expect("usage"),
        usage
    );
}

#[test]
fn a_model_version_a_deployment_runs_is_not_deleted_and_one_out_of_use_is() {
    let mut shell = Shell::with_every_device_running_m00();
    // During a rollout from m:00 to m:v2 both versions are in use.
    shell.update("d0", "m:v2");
    for reference in ["m:00", "m:v2", "m"] {
        let refused = shell.core.delete_model(reference, None);
        assert!(
            matches!(refused.reply, Err(ApiError::Conflict(ref m)) if m.contains("deployed by d0")),
            "{reference}: {:?}",
            refused.reply
        );
        assert!(refused.persist.is_empty(), "{reference}");
    }
    shell.act("d0", RolloutAction::Rollback);
    // Another tenant's token does not see the model at all.
    let hidden = shell.core.delete_model("m:v2", Some("team-a"));
    assert!(matches!(hidden.reply, Err(ApiError::NotFound(_))));
    let output = shell.core.delete_model("m:v2", None);
    let deleted = shell.run(output).expect("committed").expect("deleted");
    assert_eq!(
        deleted
            .iter()
            .map(|m| m.reference.as_str())
            .collect::<Vec<_>>(),
        ["m:v2"]
    );
    assert!(matches!(
        shell.core.model_view("m:v2"),
        Err(ApiError::NotFound(_))
    ));
    assert_eq!(shell.core.model_view("m").expect("latest").version, "00");
    // Only v2's own variant files go: the pushed file is m:00's too.
    let v2_files = vec![nephele_proto::digest_hex(&[8; 32])];
    assert_eq!(shell.removed_blobs, v2_files);
    shell.check_mirror();
    // Out of use, the whole name goes, with every file it shipped.
    shell.undeploy("d0");
    let m00_key = shell.core.catalog.versions("m")[0].key();
    let m00_files = shell.core.catalog.blob_digests(&m00_key);
    assert!(m00_files.len() >= 2, "{m00_files:?}");
    let output = shell.core.delete_model("m", None);
    let deleted = shell.run(output).expect("committed").expect("deleted");
    assert_eq!(deleted.len(), 1);
    assert_eq!(shell.removed_blobs, [v2_files, m00_files].concat());
    assert!(shell.core.model_views().is_empty());
    let again = shell.core.delete_model("m", None);
    assert!(matches!(again.reply, Err(ApiError::NotFound(_))));
    shell.check_mirror();
}
