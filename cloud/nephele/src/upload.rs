//! A file sent as a request body straight from disk, never whole in memory, with an
//! upload bar on stderr when it is a terminal (one line when the upload ends
//! otherwise, so logs of scripted pushes say how long it took).

use std::fs::File;
use std::io::{IsTerminal as _, Read, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

/// Reads the file for the request body, counting what was sent.
pub struct Upload {
    file: File,
    sent: u64,
    total: u64,
    started: Instant,
    drawn: Option<Instant>,
    finished: bool,
    terminal: bool,
    quiet: bool,
    label: String,
}

impl Upload {
    /// `path` opened for upload; `quiet` (for `--json`) draws nothing.
    pub fn open(path: &Path, label: &str, quiet: bool) -> Result<Upload> {
        let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let total = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        Ok(Upload {
            file,
            sent: 0,
            total,
            started: Instant::now(),
            drawn: None,
            finished: false,
            terminal: std::io::stderr().is_terminal(),
            quiet,
            label: label.to_string(),
        })
    }

    /// The body's length, for `Content-Length`.
    pub fn len(&self) -> u64 {
        self.total
    }

    fn draw(&mut self, done: bool) {
        if self.quiet {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = self.sent as f64 / elapsed / 1e6;
        if self.terminal {
            let width = 30u64;
            let filled = (self.sent * width).checked_div(self.total).unwrap_or(width);
            eprint!(
                "\r  uploading {} [{}{}] {:.1}/{:.1} MB {rate:.1} MB/s",
                self.label,
                "#".repeat(filled as usize),
                ".".repeat((width - filled.min(width)) as usize),
                self.sent as f64 / 1e6,
                self.total as f64 / 1e6,
            );
            if done {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        } else if done {
            eprintln!(
                "  uploaded {} ({:.1} MB in {elapsed:.1} s, {rate:.1} MB/s)",
                self.label,
                self.sent as f64 / 1e6
            );
        }
    }
}

impl Read for Upload {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.sent += n as u64;
        if self.finished {
            return Ok(n);
        }
        if n == 0 || self.sent >= self.total {
            self.finished = true;
            self.draw(true);
        } else if self.terminal
            && self
                .drawn
                .is_none_or(|at| at.elapsed() >= Duration::from_millis(100))
        {
            self.draw(false);
            self.drawn = Some(Instant::now());
        }
        Ok(n)
    }
}
