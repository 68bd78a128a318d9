//! AFL++ target `cloud_config`: see `nephele_fuzz::cloud_config` for what the input is. Built and run by
//! fuzz/run.sh (`cargo afl build --release --features ...`, `cargo afl fuzz`).

fn main() {
    afl::fuzz!(|data: &[u8]| nephele_fuzz::cloud_config(data));
}
