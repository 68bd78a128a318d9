//! What a process takes from the machine, read from `/proc` (Linux): resident memory,
//! CPU time and open file descriptors. The fleet bench samples the control plane with
//! it; nothing here needs the process's cooperation.

use std::time::Instant;

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Instant,
    pub rss_bytes: u64,
    /// Of that, anonymous memory (heap, stacks: `RssAnon`); the rest is mostly pages of
    /// the binary and libraries, which grow as new code paths first run.
    pub anon_bytes: u64,
    /// User plus system CPU time since the process started, seconds.
    pub cpu_s: f64,
    pub fds: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times: 100 on every Linux
/// architecture this runs on (`USER_HZ` is fixed at 100 for the user-space ABI).
const USER_HZ: f64 = 100.0;

/// Reads `pid` now; `None` when the process is gone or `/proc` is not Linux's.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let anon_kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let cpu_s = cpu_seconds(&stat)?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count() as u64)
        .unwrap_or(0);
    Some(Sample {
        at: Instant::now(),
        rss_bytes: rss_kb * 1024,
        anon_bytes: anon_kb * 1024,
        cpu_s,
        fds,
    })
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds. The command name (field 2)
/// is in parentheses and may hold spaces, so fields are counted after its `)`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 3.. of the line; utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// This machine's CPU model (from `/proc/cpuinfo`) and its cores, as benches print it.
pub fn cpu_and_cores() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores")
}

/// CPU cores used on average between two samples (1.0: one core busy all the time).
pub fn cores_between(before: &Sample, after: &Sample) -> f64 {
    let wall = after.at.duration_since(before.at).as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    (after.cpu_s - before.cpu_s).max(0.0) / wall
}

/// UDP datagrams the kernel dropped because a socket's receive buffer was full, on
/// the whole machine since boot (`RcvbufErrors` of `/proc/net/snmp`); `None` off Linux.
pub fn udp_receive_buffer_drops() -> Option<u64> {
    rcvbuf_errors(&std::fs::read_to_string("/proc/net/snmp").ok()?)
}

/// `RcvbufErrors` of `/proc/net/snmp`'s `Udp:` lines (a header line, then values).
fn rcvbuf_errors(snmp: &str) -> Option<u64> {
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let column = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(column)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_drops_are_read_by_their_column_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 46096168 5206 6909380 53005734 6909377 0\n\
            UdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n";
        assert_eq!(rcvbuf_errors(snmp), Some(6_909_377));
        assert_eq!(rcvbuf_errors("Udp: InDatagrams\nUdp: 1\n"), None);
        assert_eq!(rcvbuf_errors(""), None);
    }

    #[test]
    fn cpu_time_is_read_after_a_command_name_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime …
        let line =
            "4242 (nephele (cloud) x) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(cpu_seconds(line), Some(3.0));
        assert_eq!(cpu_seconds("garbage"), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let sample = sample(std::process::id()).expect("/proc/self");
        assert!(sample.rss_bytes > 0);
        assert!(sample.anon_bytes > 0 && sample.anon_bytes <= sample.rss_bytes);
        assert!(sample.fds > 0);
    }
}
