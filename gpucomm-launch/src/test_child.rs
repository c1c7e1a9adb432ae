//! Tests that must run in a process of their own (they change process-wide state: signal actions,
//! the environment): the test binary runs itself again for one child test only.

use std::process::{Command, Output};

/// Runs this test binary again for the test `name` alone, with `var` set (the child test does
/// nothing without it) and `command` adjusted by `adjust`; returns what it printed.
pub(crate) fn run(name: &str, var: &str, adjust: impl FnOnce(&mut Command)) -> Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([name, "--exact", "--nocapture", "--test-threads=1"]).env(var, "1");
    adjust(&mut command);
    command.output().unwrap()
}
