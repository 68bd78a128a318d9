//! Firmware profiles compiled into every binary, so an agent can run with `--profile NAME`
//! without the `firmware-profiles/` folder beside it. A test checks this list matches the folder.

/// (name, TOML text) of every profile in `firmware-profiles/`.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "coral-dev-board",
        include_str!("../../../firmware-profiles/coral-dev-board.toml"),
    ),
    (
        "dgx-a100-80gb",
        include_str!("../../../firmware-profiles/dgx-a100-80gb.toml"),
    ),
    (
        "gpu-1x-t4",
        include_str!("../../../firmware-profiles/gpu-1x-t4.toml"),
    ),
    (
        "gpu-4x-l4",
        include_str!("../../../firmware-profiles/gpu-4x-l4.toml"),
    ),
    (
        "hgx-h100-80gb",
        include_str!("../../../firmware-profiles/hgx-h100-80gb.toml"),
    ),
    (
        "intel-nuc-14-pro-npu",
        include_str!("../../../firmware-profiles/intel-nuc-14-pro-npu.toml"),
    ),
    (
        "jetson-agx-orin-64gb",
        include_str!("../../../firmware-profiles/jetson-agx-orin-64gb.toml"),
    ),
    (
        "jetson-orin-nano-8gb",
        include_str!("../../../firmware-profiles/jetson-orin-nano-8gb.toml"),
    ),
    (
        "rpi5-8gb",
        include_str!("../../../firmware-profiles/rpi5-8gb.toml"),
    ),
    (
        "rpi5-hailo8l",
        include_str!("../../../firmware-profiles/rpi5-hailo8l.toml"),
    ),
    (
        "x86-cpu-server",
        include_str!("../../../firmware-profiles/x86-cpu-server.toml"),
    ),
];

/// The built-in profile of that name, parsed and validated.
pub fn builtin(name: &str) -> Option<Result<crate::FirmwareProfile, crate::ProfileError>> {
    BUILTIN
        .iter()
        .find(|(builtin_name, _)| *builtin_name == name)
        .map(|(builtin_name, text)| crate::FirmwareProfile::from_toml(text, Some(builtin_name)))
}

/// Names of the built-in profiles, for error messages.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(name, _)| *name).collect()
}
