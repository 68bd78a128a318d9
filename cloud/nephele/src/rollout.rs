//! `nephele deploy update` and `nephele rollout …`: changing a deployment's version
//! or settings, rolled out in gated steps, and following, pausing, resuming or undoing
//! that rollout.

use anyhow::{bail, Result};
use nephele_api::{DeploymentSpec, DeploymentStatus, RolloutState, RolloutView};

use crate::client::{num, print_deployment, show, when_unix, ApiArgs};

/// What `nephele deploy update` may change; everything not given stays as it is.
#[derive(Debug, Clone, clap::Args)]
pub struct UpdateArgs {
    pub name: String,
    /// Model to run: `name:version` for exactly that version, `name` for its latest.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub selector: Option<String>,
    #[arg(long)]
    pub slo_ms: Option<u32>,
    #[arg(long)]
    pub max_queue: Option<u32>,
    /// Whether requests may be offloaded to the cloud pool.
    #[arg(long)]
    pub offload: Option<bool>,
    #[arg(long)]
    pub variant: Option<String>,
    #[arg(long)]
    pub hard_example_threshold: Option<f32>,
    /// Share of the devices on the new version after each step, e.g. `10,50,100`
    /// (the first is the canary; the last must be 100).
    #[arg(long, value_delimiter = ',')]
    pub steps: Option<Vec<u32>>,
    /// Requests the new version must serve in a step before its gate is judged.
    #[arg(long)]
    pub min_requests: Option<u64>,
    /// Least seconds a step lasts.
    #[arg(long)]
    pub min_step_s: Option<u64>,
    /// Seconds the step's devices have to run the new version before it rolls back.
    #[arg(long)]
    pub progress_deadline_s: Option<u64>,
    /// The gate fails when the new p99 exceeds the old by this factor...
    #[arg(long)]
    pub max_p99_ratio: Option<f64>,
    /// ...and by this many ms.
    #[arg(long)]
    pub min_p99_increase_ms: Option<f64>,
    /// Most accuracy points a new model version may lose against the old on the same
    /// labelled validation rows (judged before the first step; default 0.5).
    #[arg(long)]
    pub max_accuracy_drop: Option<f64>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RolloutCommand {
    /// Where a deployment's latest rollout is: step, devices moved, the gate, history.
    Status {
        name: String,
        /// Keep printing until the rollout completes or rolls back (exit status 1 when
        /// it rolled back).
        #[arg(long)]
        watch: bool,
    },
    /// Stop the rollout where it is (devices keep the version they run).
    Pause { name: String },
    /// Go on with a paused rollout.
    Resume { name: String },
    /// Send the devices that got the new version back to the old one.
    Undo { name: String },
}

/// `nephele deploy update`: the deployment's spec now, with the changes given.
pub fn update(args: &ApiArgs, update: UpdateArgs) -> Result<()> {
    let api = args.client()?;
    let name = update.name.clone();
    let current: DeploymentStatus = api.get_as(&format!("/v1/deployments/{name}?devices=false"))?;
    let given = update.steps.is_some()
        || update.min_requests.is_some()
        || update.min_step_s.is_some()
        || update.progress_deadline_s.is_some()
        || update.max_p99_ratio.is_some()
        || update.min_p99_increase_ms.is_some()
        || update.max_accuracy_drop.is_some();
    let rollout = match (current.rollout_settings.clone(), given) {
        (None, false) => None,
        (settings, _) => {
            let mut settings = settings.unwrap_or_default();
            if let Some(steps) = update.steps {
                settings.steps = steps;
            }
            if let Some(value) = update.min_requests {
                settings.min_requests = value;
            }
            if let Some(value) = update.min_step_s {
                settings.min_step_s = value;
            }
            if let Some(value) = update.progress_deadline_s {
                settings.progress_deadline_s = value;
            }
            if let Some(value) = update.max_p99_ratio {
                settings.max_p99_ratio = value;
            }
            if let Some(value) = update.min_p99_increase_ms {
                settings.min_p99_increase_ms = value;
            }
            if let Some(value) = update.max_accuracy_drop {
                settings.max_accuracy_drop_points = value;
            }
            Some(settings)
        }
    };
    let spec = DeploymentSpec {
        name: name.clone(),
        model: update.model.unwrap_or(current.model.clone()),
        selector: update.selector.unwrap_or(current.selector.clone()),
        slo_ms: update.slo_ms.unwrap_or(current.slo_ms),
        offload: update.offload.unwrap_or(current.offload),
        max_queue: update.max_queue.unwrap_or(current.max_queue),
        variant: update.variant.unwrap_or(current.variant.clone()),
        hard_example_threshold: update
            .hard_example_threshold
            .or(current.hard_example_threshold),
        replicas: current.replicas.clone(),
        rollout,
        tenant: None,
    };
    let status: DeploymentStatus = api.put_as(&format!("/v1/deployments/{name}"), &spec)?;
    let number = |d: &DeploymentStatus| d.rollout.as_ref().map(|r| r.number);
    let started = number(&status) != number(&current);
    show(args.json, &status, |d| {
        print_deployment(d);
        match d.rollout.as_ref().filter(|_| started) {
            Some(rollout) => {
                print_rollout(&name, rollout);
                println!("  follow it: nephele rollout status {name} --watch");
            }
            None => println!("  nothing devices run changed: applied at once, no rollout"),
        }
    });
    Ok(())
}

/// `nephele rollout …`.
pub fn run(args: ApiArgs, command: RolloutCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        RolloutCommand::Status { name, watch } => {
            let mut last_events = 0;
            loop {
                let rollout: RolloutView =
                    api.get_as(&format!("/v1/deployments/{name}/rollout"))?;
                if !watch {
                    show(args.json, &rollout, |r| print_rollout(&name, r));
                    return Ok(());
                }
                if args.json {
                    if rollout.events.len() != last_events {
                        println!("{}", serde_json::to_string(&rollout).unwrap_or_default());
                    }
                } else {
                    for event in rollout.events.iter().skip(last_events) {
                        println!("{}  {}", at(event.at_unix_ms), event.message);
                    }
                }
                last_events = rollout.events.len();
                match rollout.state {
                    RolloutState::Complete => return Ok(()),
                    RolloutState::RolledBack => {
                        bail!("rollout of {name} rolled back: {}", rollout.gate)
                    }
                    _ => std::thread::sleep(std::time::Duration::from_secs(1)),
                }
            }
        }
        RolloutCommand::Pause { name } => act(&args, &name, "pause"),
        RolloutCommand::Resume { name } => act(&args, &name, "resume"),
        RolloutCommand::Undo { name } => act(&args, &name, "rollback"),
    }
}

fn act(args: &ApiArgs, name: &str, action: &str) -> Result<()> {
    let status: DeploymentStatus = args.client()?.post_as(
        &format!("/v1/deployments/{name}/rollout/{action}"),
        &serde_json::Value::Null,
    )?;
    show(args.json, &status, |d| match &d.rollout {
        Some(rollout) => print_rollout(name, rollout),
        None => print_deployment(d),
    });
    Ok(())
}

fn print_rollout(name: &str, r: &RolloutView) {
    let steps: Vec<String> = r.steps.iter().map(|p| format!("{p}%")).collect();
    println!(
        "rollout {} of deployment {name}: {} (step {} of {}: {})",
        r.number,
        num(Some(r.state)).replace('_', " "),
        r.step,
        steps.len(),
        steps.join(" → ")
    );
    println!("  {} → {}", r.from.model, r.to.model);
    println!(
        "  devices on the new version: {} of {} selected{}",
        r.moved_devices.len(),
        r.selected_devices,
        if r.moved_devices.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.moved_devices.join(", "))
        }
    );
    println!("  gate: {}", r.gate);
    println!("  started {}", at(r.started_unix_ms));
    for event in &r.events {
        println!("    {}  {}", at(event.at_unix_ms), event.message);
    }
}

/// A unix millisecond as a date and an age.
fn at(unix_ms: u64) -> String {
    when_unix(Some(unix_ms / 1000))
}
