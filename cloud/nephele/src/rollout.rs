//! `nephele deploy update` and `nephele rollout …`: changing a deployment's version
//! or settings, rolled out in gated steps, and following, pausing, resuming or undoing
//! that rollout.

use anyhow::{bail, Result};
use serde_json::Value;

use crate::client::{print, print_deployment, s, when, ApiArgs};

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
    let api = args.client();
    let name = update.name.clone();
    let current = api.get(&format!("/v1/deployments/{name}"))?;
    let field = |key: &str| current.get(key).cloned().unwrap_or(Value::Null);
    let mut rollout = match current.get("rollout_settings") {
        Some(Value::Object(settings)) => settings.clone(),
        _ => serde_json::Map::new(),
    };
    let overrides = [
        ("steps", update.steps.map(Value::from)),
        ("min_requests", update.min_requests.map(Value::from)),
        ("min_step_s", update.min_step_s.map(Value::from)),
        (
            "progress_deadline_s",
            update.progress_deadline_s.map(Value::from),
        ),
        ("max_p99_ratio", update.max_p99_ratio.map(Value::from)),
        (
            "min_p99_increase_ms",
            update.min_p99_increase_ms.map(Value::from),
        ),
        (
            "max_accuracy_drop_points",
            update.max_accuracy_drop.map(Value::from),
        ),
    ];
    let mut rollout_given = !rollout.is_empty();
    for (key, value) in overrides {
        if let Some(value) = value {
            rollout.insert(key.into(), value);
            rollout_given = true;
        }
    }
    let mut spec = serde_json::json!({
        "name": name,
        "model": update.model.map(Value::from).unwrap_or_else(|| field("model")),
        "selector": update.selector.map(Value::from).unwrap_or_else(|| field("selector")),
        "slo_ms": update.slo_ms.map(Value::from).unwrap_or_else(|| field("slo_ms")),
        "max_queue": update.max_queue.map(Value::from).unwrap_or_else(|| field("max_queue")),
        "offload": update.offload.map(Value::from).unwrap_or_else(|| field("offload")),
        "variant": update.variant.map(Value::from).unwrap_or_else(|| field("variant")),
        "hard_example_threshold": update
            .hard_example_threshold
            .map(Value::from)
            .unwrap_or_else(|| field("hard_example_threshold")),
        "replicas": field("replicas"),
    });
    if rollout_given {
        spec["rollout"] = Value::Object(rollout);
    }
    let value = api.put_json(&format!("/v1/deployments/{name}"), &spec)?;
    let number = |v: &Value| v.pointer("/rollout/number").and_then(Value::as_u64);
    let started = number(&value) != number(&current);
    print(args.json, &value, |v| {
        print_deployment(v);
        match v.get("rollout").filter(|r| started && !r.is_null()) {
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
    let api = args.client();
    match command {
        RolloutCommand::Status { name, watch } => {
            let mut last_events = 0;
            loop {
                let value = api.get(&format!("/v1/deployments/{name}/rollout"))?;
                let state = s(&value, "state");
                if !watch {
                    print(args.json, &value, |v| print_rollout(&name, v));
                    return Ok(());
                }
                let events = value
                    .get("events")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if args.json {
                    if events.len() != last_events {
                        println!("{}", serde_json::to_string(&value).unwrap_or_default());
                    }
                } else {
                    for event in events.iter().skip(last_events) {
                        println!("{}  {}", at(event.get("at_unix_ms")), s(event, "message"));
                    }
                }
                last_events = events.len();
                match state.as_str() {
                    "complete" => return Ok(()),
                    "rolled_back" => bail!("rollout of {name} rolled back: {}", s(&value, "gate")),
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
    let value = args.client().post(
        &format!("/v1/deployments/{name}/rollout/{action}"),
        &Value::Null,
    )?;
    print(args.json, &value, |v| match v.get("rollout") {
        Some(rollout) if !rollout.is_null() => print_rollout(name, rollout),
        _ => print_deployment(v),
    });
    Ok(())
}

fn print_rollout(name: &str, r: &Value) {
    let steps: Vec<String> = r
        .get("steps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| format!("{p}%"))
        .collect();
    let moved = r
        .get("moved_devices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    println!(
        "rollout {} of deployment {name}: {} (step {} of {}: {})",
        s(r, "number"),
        s(r, "state").replace('_', " "),
        s(r, "step"),
        steps.len(),
        steps.join(" → ")
    );
    println!(
        "  {} → {}",
        s(r.get("from").unwrap_or(&Value::Null), "model"),
        s(r.get("to").unwrap_or(&Value::Null), "model")
    );
    println!(
        "  devices on the new version: {} of {} selected{}",
        moved.len(),
        s(r, "selected_devices"),
        if moved.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                moved
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!("  gate: {}", s(r, "gate"));
    println!("  started {}", at(r.get("started_unix_ms")));
    for event in r
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        println!(
            "    {}  {}",
            at(event.get("at_unix_ms")),
            s(event, "message")
        );
    }
}

/// A unix millisecond as a date and an age.
fn at(value: Option<&Value>) -> String {
    let seconds = value
        .and_then(Value::as_u64)
        .map(|ms| Value::from(ms / 1000));
    when(seconds.as_ref())
}
