//! The control plane's target (`cloud_config`; cargo feature `cloud`). A file of its own
//! for the same reason as `edge_targets.rs`: the workspace's tests include it by path.

/// Input: a control-plane config file (`nephele-cloud --config`), parsed and validated
/// by `CloudConfig::from_toml`. An accepted config is printed as `--print-config`
/// prints it, and that text must be accepted again.
pub fn cloud_config(data: &[u8]) {
    use nephele_cloud::config::CloudConfig;
    let text = String::from_utf8_lossy(data);
    let Ok(config) = CloudConfig::from_toml(&text) else {
        return;
    };
    assert!(
        config.validate().is_ok(),
        "from_toml accepted an invalid config"
    );
    if let Ok(printed) = toml::to_string_pretty(&config) {
        let again = CloudConfig::from_toml(&printed);
        assert!(
            again.is_ok(),
            "--print-config output is refused: {again:?}\n{printed}"
        );
    }
}
