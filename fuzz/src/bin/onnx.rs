//! AFL++ target `onnx`: see `nephele_fuzz::onnx` for what the input is. Built and run by
//! fuzz/run.sh (`cargo afl build --release --features ...`, `cargo afl fuzz`).
//!
//! `fuzz_nohook!`, not `fuzz!`: the runtime catches a panic of tract's parser and
//! answers the upload with an error (`guard_parser`); `fuzz!`'s panic hook would abort
//! before that. A panic that escapes the runtime still aborts (afl catches it around
//! each input), so it is still a crash. The hook is silenced so that the many caught
//! panics do not print a message (and capture a backtrace) on every input.

fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    afl::fuzz_nohook!(|data: &[u8]| nephele_fuzz::onnx(data));
}
