//! What a node reports of itself in `Hello`: the address gang members reach it at
//! (from `--advertise-address`) and its GPUs as the driver lists them.
//!
//! GPUs come from `nvidia-smi -L`, when that command exists and answers within a few
//! seconds; anything else (no driver, a hung driver, output it cannot parse) reports
//! no GPUs rather than failing the agent. The parser is pure and reads both the
//! current MIG line format and the one of R450-era drivers.

use std::process::{Command, Stdio};
use std::time::Duration;

use nephele_proto::{GpuReport, MigReport};

/// How long `nvidia-smi -L` may take before the agent goes on without GPUs.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// Parses `nvidia-smi -L` output. Lines it does not know are skipped; a MIG line
/// belongs to the GPU line before it.
///
/// ```text
/// GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-…)
///   MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-…)
/// ```
pub fn parse_nvidia_smi_list(text: &str) -> Vec<GpuReport> {
    let mut gpus: Vec<GpuReport> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("GPU ") {
            let Some((index, described)) = rest.split_once(':') else {
                continue;
            };
            let Ok(index) = index.trim().parse::<u32>() else {
                continue;
            };
            let Some((model, uuid)) = split_uuid(described) else {
                continue;
            };
            gpus.push(GpuReport {
                index,
                model: model.to_string(),
                uuid: uuid.to_string(),
                mig: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("MIG ") {
            let Some(profile) = rest.split_whitespace().next() else {
                continue;
            };
            let Some((_, uuid)) = split_uuid(rest) else {
                continue;
            };
            if let Some(gpu) = gpus.last_mut() {
                gpu.mig.push(MigReport {
                    profile: profile.to_string(),
                    uuid: uuid.to_string(),
                });
            }
        }
    }
    gpus
}

/// `"<before> (UUID: <uuid>)"` → (before, uuid), the UUID being the last one on the line.
fn split_uuid(text: &str) -> Option<(&str, &str)> {
    let at = text.rfind("(UUID:")?;
    let uuid = text[at + "(UUID:".len()..].trim().strip_suffix(')')?.trim();
    if uuid.is_empty() {
        return None;
    }
    Some((text[..at].trim(), uuid))
}

/// GPUs of this node from `nvidia-smi -L`, or none (see the module doc). Blocking: call
/// it off the async workers.
pub fn detect_gpus(timeout: Duration) -> Vec<GpuReport> {
    let child = match Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(_) => return Vec::new(),
    };
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    // Reading the whole output on a thread of its own keeps a chatty or hung driver
    // from blocking the agent past the timeout.
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(timeout) {
        Ok(Ok(output)) if output.status.success() => {
            parse_nvidia_smi_list(&String::from_utf8_lossy(&output.stdout))
        }
        Ok(_) => Vec::new(),
        Err(_) => {
            tracing::warn!(
                timeout_s = timeout.as_secs(),
                "nvidia-smi -L did not answer; reporting no GPUs"
            );
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU as a test writes it: index, model, UUID, MIG (profile, UUID) pairs.
    type Gpu<'a> = (u32, &'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn check(text: &str, expected: &[Gpu]) {
        let parsed = parse_nvidia_smi_list(text);
        let expected: Vec<GpuReport> = expected
            .iter()
            .map(|(index, model, uuid, mig)| GpuReport {
                index: *index,
                model: model.to_string(),
                uuid: uuid.to_string(),
                mig: mig
                    .iter()
                    .map(|(profile, uuid)| MigReport {
                        profile: profile.to_string(),
                        uuid: uuid.to_string(),
                    })
                    .collect(),
            })
            .collect();
        assert_eq!(parsed, expected, "{text}");
    }

    #[test]
    fn plain_gpus() {
        check(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1d3e8a5c-2a4b-4b8e-9f3c-0a1b2c3d4e5f)\n\
             GPU 1: Tesla T4 (UUID: GPU-9b8a7c6d-5e4f-3a2b-1c0d-ffeeddccbbaa)\n",
            &[
                (
                    0,
                    "NVIDIA H100 80GB HBM3",
                    "GPU-1d3e8a5c-2a4b-4b8e-9f3c-0a1b2c3d4e5f",
                    &[],
                ),
                (
                    1,
                    "Tesla T4",
                    "GPU-9b8a7c6d-5e4f-3a2b-1c0d-ffeeddccbbaa",
                    &[],
                ),
            ],
        );
    }

    #[test]
    fn mig_devices_belong_to_the_gpu_above_them() {
        check(
            "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n\
             \x20 MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n\
             \x20 MIG 1g.10gb     Device  1: (UUID: MIG-0f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0)\n\
             GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n",
            &[
                (
                    0,
                    "NVIDIA A100-SXM4-80GB",
                    "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77",
                    &[
                        ("3g.40gb", "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"),
                        ("1g.10gb", "MIG-0f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0"),
                    ],
                ),
                (
                    1,
                    "NVIDIA A100-SXM4-80GB",
                    "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                    &[],
                ),
            ],
        );
    }

    #[test]
    fn old_driver_mig_lines() {
        check(
            "GPU 0: A100-SXM4-40GB (UUID: GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2)\n\
             \x20 MIG 3g.20gb Device 0: (UUID: MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/1/0)\n",
            &[(
                0,
                "A100-SXM4-40GB",
                "GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2",
                &[(
                    "3g.20gb",
                    "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/1/0",
                )],
            )],
        );
    }

    #[test]
    fn nothing_or_noise_is_no_gpus() {
        check("", &[]);
        check("No devices were found\n", &[]);
        check(
            "GPU x: broken (UUID: GPU-1)\nGPU 0: no uuid here\n  MIG 1g.5gb Device 0: (UUID: MIG-orphan)\n",
            &[],
        );
        // Windows line endings and a model with parentheses.
        check(
            "GPU 2: NVIDIA RTX A6000 (rev 2) (UUID: GPU-abc)\r\n",
            &[(2, "NVIDIA RTX A6000 (rev 2)", "GPU-abc", &[])],
        );
    }
}
