//! AFL++ target `frame_decoder`: see `nephele_fuzz::frame_decoder` for what the input is. Built and run by
//! fuzz/run.sh (`cargo afl build --release --features ...`, `cargo afl fuzz`).

fn main() {
    afl::fuzz!(|data: &[u8]| nephele_fuzz::frame_decoder(data));
}
