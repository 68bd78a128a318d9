//! AFL++ target `firmware_profile`: see `nephele_fuzz::firmware_profile` for what the input is. Built and run by
//! fuzz/run.sh (`cargo afl build --release --features ...`, `cargo afl fuzz`).

fn main() {
    afl::fuzz!(|data: &[u8]| nephele_fuzz::firmware_profile(data));
}
