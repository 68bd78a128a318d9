//! `nephele job`: jobs and gangs in a region's scheduler.

use anyhow::{bail, Context as _, Result};
use nephele_api::*;
use serde_json::Value;

use super::*;

// Parsed once per invocation from the command line; boxing the big variant would only
// make the clap derive harder to read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum JobCommand {
    /// Queue a job (one pod, or a gang of `--members` identical pods placed all or none)
    /// in a region's scheduler; prints where it went or why it waits.
    Submit {
        name: String,
        /// Region to queue in; `auto` lets the control plane choose by carbon, price
        /// and free capacity.
        #[arg(long)]
        region: Option<String>,
        /// Tenant to charge (admins only; default: the token's tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Finish within this long (`90m`, `8h`, `2d`) or by this unix second: the job
        /// may wait for a lower-carbon hour (needs --runtime).
        #[arg(long)]
        deadline: Option<String>,
        /// `best-effort`, `batch`, `production`, `system` or a number.
        #[arg(long, default_value = "batch")]
        priority: String,
        #[arg(long, default_value_t = 1)]
        members: u16,
        /// Per member.
        #[arg(long, default_value_t = 0)]
        gpus: u8,
        /// Share of one GPU in milli-GPU (with --gpus 1).
        #[arg(long)]
        gpu_milli: Option<u32>,
        /// Acceptable GPU model, e.g. "NVIDIA L4" (repeat for several).
        #[arg(long = "gpu-model")]
        gpu_models: Vec<String>,
        /// One MIG slice of this profile instead of GPUs, e.g. 1g.10gb.
        #[arg(long)]
        mig_profile: Option<String>,
        #[arg(long, default_value_t = 1000)]
        cpu_milli: u64,
        #[arg(long, default_value_t = 1024)]
        memory_mib: u64,
        /// `any`, `same-node` or `prefer-same-node`.
        #[arg(long, default_value = "any")]
        topology: String,
        /// Expected runtime in seconds (lets backfilling use the gap before a reservation).
        #[arg(long)]
        runtime: Option<u64>,
        /// Never preempt it (default: preemptible below `production`).
        #[arg(long)]
        no_preempt: bool,
        /// May run on spot capacity.
        #[arg(long)]
        spot_ok: bool,
        /// Required node label, `key=value` (repeat for several).
        #[arg(long = "selector")]
        selectors: Vec<String>,
        /// Environment of every member, `KEY=VALUE` (repeat for several).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Working directory of every member on its node.
        #[arg(long)]
        workdir: Option<String>,
        /// Times a failed attempt is retried (default 3).
        #[arg(long)]
        retries: Option<u32>,
        /// Only hold the resources, running nothing (a reservation, or a placeholder
        /// for work started outside nephele); without it a command after `--` is needed.
        #[arg(long)]
        hold: bool,
        /// The program each member runs and its arguments, after `--`
        /// (e.g. `-- python3 train.py --epochs 3`).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// A member's output (stdout and stderr as they came), from its pool node.
    Logs {
        name: String,
        /// Which member (its RANK).
        #[arg(long, default_value_t = 0)]
        member: u16,
        /// Which attempt (default: the current one).
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing as the member writes, until it exits.
        #[arg(long, short = 'f')]
        follow: bool,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Jobs with their state and nodes.
    List {
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// Only the jobs in this state.
        #[arg(long, value_parser = nephele_cloud::api::JOB_STATES)]
        state: Option<String>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// One job: placement, or why it is not placed.
    Get {
        name: String,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Cancel or end a job; its resources go back at once.
    Delete {
        name: String,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
}

/// `90m`, `8h`, `2d` (from `now`) or a unix second.
fn parse_deadline(text: &str, now: u64) -> Result<u64> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = number
        .parse()
        .with_context(|| format!("--deadline {text:?}: expected 90m, 8h, 2d or a unix second"))?;
    let seconds = match unit {
        "" => return Ok(value),
        "s" => value,
        "m" => value * 60,
        "h" => value * 3600,
        "d" => value * 86_400,
        _ => bail!("--deadline {text:?}: the unit must be s, m, h or d"),
    };
    Ok(now + seconds)
}

fn query(region: &Option<String>, tenant: &Option<String>) -> String {
    let mut parts = Vec::new();
    if let Some(region) = region {
        parts.push(format!("region={region}"));
    }
    if let Some(tenant) = tenant {
        parts.push(format!("tenant={tenant}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn job_nodes(job: &JobView) -> String {
    let nodes: Vec<String> = job
        .placement
        .iter()
        .map(|m| {
            let gpus: Vec<String> = m
                .gpus
                .iter()
                .map(|g| {
                    if g.milli == 1000 {
                        g.gpu.to_string()
                    } else {
                        format!("{}:{}m", g.gpu, g.milli)
                    }
                })
                .collect();
            if gpus.is_empty() {
                m.node.clone()
            } else {
                format!("{}[{}]", m.node, gpus.join(","))
            }
        })
        .collect();
    if nodes.is_empty() {
        "-".into()
    } else {
        nodes.join(" ")
    }
}

fn print_carbon_plan(job: &JobView) {
    if let Some(plan) = &job.deferral {
        println!(
            "  carbon: {} (deadline {}, starts by {} at the latest)",
            plan.reason,
            utc(plan.deadline_unix),
            utc(plan.latest_start_unix)
        );
        if let (Some(then), Some(now)) = (plan.carbon_at_submit, plan.carbon_now) {
            if plan.state == "released" {
                println!(
                    "  carbon: {now:.0} g/kWh at release against {then:.0} had it started on submission ({:+.1}%)",
                    (now - then) / then.max(1e-9) * 100.0
                );
            }
        }
    }
    if let Some(choice) = &job.region_choice {
        println!("  region: {} ({})", choice.chosen, choice.reason);
        for c in &choice.candidates {
            let carbon = c
                .carbon_g_per_kwh
                .map_or("-".into(), |v| format!("{v:.0} g/kWh"));
            let price = c
                .price_per_mwh
                .map_or("-".into(), |v| format!("{v:.1}/MWh"));
            let verdict = match (c.score, &c.excluded) {
                (Some(score), _) => format!("score {score:.2}"),
                (None, Some(why)) => format!("excluded: {why}"),
                _ => "-".into(),
            };
            println!(
                "    {:<12} {:>10} {:>10} free {:>6} {}  {verdict}",
                c.region,
                carbon,
                price,
                num(Some(c.free)),
                choice.unit
            );
        }
    }
}

/// How the last attempt ended (`failed: member 0 could not start: …`), if it did.
fn last_outcome(job: &JobView) -> Option<&str> {
    job.attempts.last().and_then(|a| a.outcome.as_deref())
}

fn print_job(job: &JobView) {
    println!(
        "job {}/{} in region {}: {} (priority {}, {} member(s))",
        job.tenant, job.name, job.region, job.state, job.priority, job.spec.members
    );
    print_carbon_plan(job);
    match job.state.as_str() {
        "deferred" => {}
        "pending" => {
            if let Some(why) = &job.why_pending {
                println!("  not placed: {}", why.message);
                if let Some(hint) = &why.hint {
                    println!("  hint: {hint}");
                }
            }
        }
        "backoff" => println!(
            "  attempt {} {}; runs again at {}",
            job.attempt,
            last_outcome(job).unwrap_or("failed"),
            when_unix(job.retry_at_unix)
        ),
        "succeeded" | "failed" => println!("  {}", text(job.outcome.as_deref())),
        state => {
            println!("  nodes: {}", job_nodes(job));
            if state == "terminating" {
                println!(
                    "  stopping ({}); resources taken at {}",
                    match &job.preempted_by {
                        None => "drained or failed".to_string(),
                        Some(by) => format!("preempted by {by}"),
                    },
                    when_unix(job.grace_deadline_unix)
                );
            }
        }
    }
    if !job.members.is_empty() {
        println!("  attempt {}:", job.attempt);
        println!(
            "    {:<6} {:<10} {:<16} {:>8} {:>6}",
            "MEMBER", "NODE", "STATE", "PID", "EXIT"
        );
        for m in &job.members {
            let exit = match (m.exit_code, m.signal) {
                (Some(code), _) => code.to_string(),
                (_, Some(signal)) => format!("sig {signal}"),
                _ => "-".into(),
            };
            println!(
                "    {:<6} {:<10} {:<16} {:>8} {:>6}",
                m.member,
                m.node,
                m.state,
                num(m.pid),
                exit
            );
            if let Some(error) = &m.error {
                println!("           {error}");
            }
        }
    }
    if job.attempts.len() > 1 {
        println!("  attempts:");
        for a in &job.attempts {
            println!(
                "    #{:<3} started {}  {}",
                a.attempt,
                when_unix(Some(a.started_unix)),
                a.outcome.as_deref().unwrap_or("running")
            );
        }
    }
}

pub fn job(args: ApiArgs, command: JobCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        JobCommand::Submit {
            name,
            region,
            tenant,
            deadline,
            priority,
            members,
            gpus,
            gpu_milli,
            gpu_models,
            mig_profile,
            cpu_milli,
            memory_mib,
            topology,
            runtime,
            no_preempt,
            spot_ok,
            selectors,
            env,
            workdir,
            retries,
            hold,
            command,
        } => {
            match (hold, command.is_empty()) {
                (false, true) => bail!(
                    "job {name}: give the program its members run after `--` (e.g. `nephele job submit {name} --gpus 1 -- python3 train.py`), or --hold to only hold the resources"
                ),
                (true, false) => {
                    bail!("job {name}: --hold runs nothing; drop it or the command after `--`")
                }
                _ => {}
            }
            let mut spec = JobSpec::named(&name);
            for pair in env {
                let (key, value) = pair
                    .split_once('=')
                    .with_context(|| format!("--env {pair:?} is not KEY=VALUE"))?;
                spec.env.insert(key.into(), value.into());
            }
            for selector in selectors {
                let (key, value) = selector
                    .split_once('=')
                    .with_context(|| format!("--selector {selector:?} is not key=value"))?;
                spec.node_selector.insert(key.into(), value.into());
            }
            spec.region = region;
            spec.tenant = tenant;
            spec.priority = Some(match priority.parse::<u32>() {
                Ok(value) => PrioritySpec::Value(value),
                Err(_) => PrioritySpec::Class(priority),
            });
            spec.members = members;
            spec.gpus = gpus;
            spec.gpu_milli = gpu_milli;
            spec.gpu_models = gpu_models;
            spec.mig_profile = mig_profile;
            spec.cpu_milli = cpu_milli;
            spec.memory_mib = memory_mib;
            spec.topology =
                serde_json::from_value(Value::String(topology.clone())).map_err(|_| {
                    anyhow::anyhow!(
                        "--topology {topology:?}: give any, same-node or prefer-same-node"
                    )
                })?;
            spec.expected_runtime_s = runtime;
            spec.spot_ok = spot_ok;
            if no_preempt {
                spec.preemptible = Some(false);
            }
            if !command.is_empty() {
                spec.command = command;
                spec.working_dir = workdir;
            } else if !spec.env.is_empty() || workdir.is_some() {
                bail!("--env and --workdir need a command after `--`");
            }
            spec.max_retries = retries;
            if let Some(deadline) = deadline {
                spec.deadline_unix = Some(parse_deadline(&deadline, unix_now())?);
            }
            let job: JobView = api.post_as("/v1/jobs", &spec)?;
            show(args.json, &job, print_job);
        }
        JobCommand::List {
            region,
            tenant,
            state,
            list,
        } => {
            let mut path = format!("/v1/jobs{}", query(&region, &tenant));
            if let Some(state) = state {
                path.push(if path.contains('?') { '&' } else { '?' });
                path.push_str(&format!("state={state}"));
            }
            let listing = list.read::<JobView>(&api, &path)?;
            show(args.json, &listing.items, |jobs| {
                println!(
                    "{:<10} {:<20} {:<10} {:<12} {:>8} {:>7}  NODES / WHY",
                    "TENANT", "NAME", "REGION", "STATE", "PRIORITY", "MEMBERS"
                );
                for j in jobs {
                    let detail = match j.state.as_str() {
                        "pending" => text(j.why_pending.as_ref().map(|w| w.message.as_str())),
                        "deferred" => text(j.deferral.as_ref().map(|d| d.reason.as_str())),
                        "backoff" => text(last_outcome(j)),
                        "failed" => text(j.outcome.as_deref()),
                        _ => job_nodes(j),
                    };
                    println!(
                        "{:<10} {:<20} {:<10} {:<12} {:>8} {:>7}  {}",
                        j.tenant, j.name, j.region, j.state, j.priority, j.spec.members, detail
                    );
                }
                if let Some(line) = listing.left_out("jobs") {
                    println!("{line}");
                }
            });
        }
        JobCommand::Get {
            name,
            region,
            tenant,
        } => {
            let job: JobView =
                api.get_as(&format!("/v1/jobs/{name}{}", query(&region, &tenant)))?;
            show(args.json, &job, print_job);
        }
        JobCommand::Logs {
            name,
            member,
            attempt,
            follow,
            region,
            tenant,
        } => {
            let mut offset = 0u64;
            let mut base = query(&region, &tenant);
            base.push(if base.is_empty() { '?' } else { '&' });
            base.push_str(&format!("member={member}"));
            if let Some(attempt) = attempt {
                base.push_str(&format!("&attempt={attempt}"));
            }
            loop {
                let logs: JobLogsView =
                    api.get_as(&format!("/v1/jobs/{name}/logs{base}&offset={offset}"))?;
                if args.json && !follow {
                    show(true, &logs, |_| {});
                    return Ok(());
                }
                print!("{}", logs.data);
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                offset = logs.next_offset;
                let (finished, size) = (logs.finished, logs.size);
                if offset < size {
                    continue;
                }
                if !follow || finished {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
        JobCommand::Delete {
            name,
            region,
            tenant,
        } => {
            let job: JobView =
                api.delete_as(&format!("/v1/jobs/{name}{}", query(&region, &tenant)))?;
            show(args.json, &job, |j| {
                println!("deleted job {}/{} (was {})", j.tenant, j.name, j.state)
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_parse_relative_or_absolute() {
        assert_eq!(parse_deadline("8h", 1000).expect("ok"), 1000 + 8 * 3600);
        assert_eq!(parse_deadline("90m", 0).expect("ok"), 5400);
        assert_eq!(parse_deadline("2d", 0).expect("ok"), 172_800);
        assert_eq!(parse_deadline("1700000000", 5).expect("ok"), 1_700_000_000);
        assert!(parse_deadline("8 hours", 0).is_err());
        assert!(parse_deadline("h", 0).is_err());
        assert!(parse_deadline("3w", 0).is_err());
    }
}
