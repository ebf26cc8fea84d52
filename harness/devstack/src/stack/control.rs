//! Controlling the stack's processes as an operator's tools would: a rolling replacement
//! (another build on the same state and sockets), a power loss and the start after it.

use super::Stack;
use crate::procs::Process;
use anyhow::Context;
use std::path::Path;
use std::time::Duration;

impl Stack {
    /// Replaces component `name` as a rolling update does ([`Process::replace`]: SIGTERM, the
    /// grace period, the new binary — `program`, or the same one — on the same state and
    /// sockets), waits until the new one answers `ready_url`, and records its pid.
    pub async fn replace(
        &mut self,
        name: &str,
        program: Option<&Path>,
        grace: Duration,
        ready_url: &str,
    ) -> anyhow::Result<crate::procs::Stopped> {
        let process = self
            .processes
            .iter_mut()
            .find(|p| p.command.name == name)
            .with_context(|| format!("no {name} in the stack"))?;
        let stopped = process.replace(program, grace).await?;
        process.wait_http_ok(ready_url).await?;
        self.write_stack_json()?;
        Ok(stopped)
    }

    /// Component `name`'s process.
    fn process_mut(&mut self, name: &str) -> anyhow::Result<&mut Process> {
        self.processes
            .iter_mut()
            .find(|p| p.command.name == name)
            .with_context(|| format!("no {name} in the stack"))
    }

    /// Kills component `name` at once, as a power loss does (until [`Stack::start_again_with`],
    /// which [`Stack::restart_exited`] would otherwise do).
    pub async fn kill_now(&mut self, name: &str) -> anyhow::Result<()> {
        self.process_mut(name)?.kill_now().await;
        Ok(())
    }

    /// Starts component `name` again with `--<flag>=<value>`, waits until it answers
    /// `ready_url`, and records its pid.
    pub async fn start_again_with(
        &mut self,
        name: &str,
        flag: &str,
        value: &str,
        ready_url: &str,
    ) -> anyhow::Result<()> {
        let process = self.process_mut(name)?;
        process.start_again_with(flag, value)?;
        process.wait_http_ok(ready_url).await?;
        self.write_stack_json()
    }

    /// The binary component `name` runs.
    pub fn program_of(&self, name: &str) -> Option<&Path> {
        self.processes
            .iter()
            .find(|p| p.command.name == name)
            .map(|p| p.command.program.as_path())
    }
}
