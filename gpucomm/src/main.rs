//! `gpucomm`: `doctor` (is NVLink really used, layer by layer) and `bench` (nccl-tests in Rust,
//! with plots). See `gpucomm/README.md`.
#![deny(missing_docs)]

mod bench;
mod cli;
mod cuda;
mod doctor;
mod error;
mod json_stdout;
mod ncclog;
mod progress;
mod units;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::CliError;

fn main() -> ExitCode {
    // Before anything can load NCCL or NVSHMEM, and while this process has one thread.
    let overridden = gpucomm_launch::safety::enforce();
    let cli = Cli::parse();
    if let Some(w) = gpucomm_launch::safety::warning(&overridden) {
        if !matches!(cli.command, Command::DoctorWorker(_) | Command::ProbeNccl { .. }) {
            eprintln!("note: {w}");
        }
    }
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(&args, &overridden),
        Command::Bench(args) => bench::run(&args),
        Command::Compare(args) => bench::compare::run(&args),
        Command::DoctorWorker(args) => doctor::worker::run(&args),
        Command::ProbeNccl { library } => doctor::libs::probe_main(&library),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

/// Prints `error: …` and one `caused by:` line per source (the doctor's ✗ summary is already on
/// screen, so it only gets its one line).
fn report(error: &CliError) {
    let mut text = format!("error: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!("\n  caused by: {cause}"));
        source = cause.source();
    }
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}
