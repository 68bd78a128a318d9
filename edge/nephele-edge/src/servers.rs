//! The control plane's addresses as an agent is configured with them (`--server`,
//! comma-separated replicas), and how long a connection to each may take. Pure: used
//! by the session core and by enrolment alike.

use std::time::Duration;

/// The control-plane addresses in `server` (comma-separated HOST:PORT).
pub fn servers(server: &str) -> Vec<&str> {
    server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// How long one connection attempt may take: shorter when there are other replicas to
/// try (a dead replica's UDP port does not refuse, it stays silent).
pub fn connect_timeout(server: &str, alone: Duration) -> Duration {
    if servers(server).len() > 1 {
        alone.min(Duration::from_secs(4))
    } else {
        alone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_servers_are_tried_each_for_less_time() {
        assert_eq!(servers(" a:1, b:2 ,,"), ["a:1", "b:2"]);
        assert!(servers("").is_empty());
        let alone = Duration::from_secs(10);
        assert_eq!(connect_timeout("a:1", alone), alone);
        assert_eq!(connect_timeout("a:1,b:2", alone), Duration::from_secs(4));
    }
}
