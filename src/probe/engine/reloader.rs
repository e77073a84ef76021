//! Reloading `serve`'s configuration file (SIGHUP, `POST /-/reload`): what changed,
//! applied to the running targets, or refused with the running configuration kept.
//!
//! Targets are compared by name and by every field, and by the key their variable holds
//! (a rotated key is a change); `listen` (unless the process was given its own),
//! `state_file`, `max_concurrent_cycles` and the `[monitor]` table need a restart, and a
//! reload that changes them is refused, as is a file that does not load. One reload at
//! a time, each compared with what the one before applied.

use std::collections::HashMap;
use std::path::PathBuf;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::config::Config;
use super::reload::{Reload, ReloadError, ReloadMetrics, ReloadReport};
use super::runtime::{ControlError, TargetChanges, TargetControl};
use super::scheduler::TargetSchedule;
use crate::probe::checks::settings::ProbeSettings;

/// The configuration in force, with the key each target's variable held when it was
/// applied (the same fields with another key is a changed target).
#[derive(Debug)]
struct Applied<M> {
    config: Config<M>,
    keys: HashMap<String, String>,
}

impl<M> Applied<M> {
    fn new(config: Config<M>, targets: &[(ProbeSettings, TargetSchedule)]) -> Self {
        let keys = targets.iter().map(|(s, _)| (s.name.clone(), s.api_key.clone())).collect();
        Self { config, keys }
    }
}

/// Re-reads `serve`'s configuration file and applies what changed; one reload at a time.
/// `M` is what the file's `[monitor]` table is read as (see [`Config`]): a changed one,
/// compared as read, needs a restart.
#[derive(Debug)]
pub struct ConfigReloader<M = toml::Table> {
    path: PathBuf,
    /// `--listen` was given: the file's `listen` is not used, so it may change.
    listen_flag: bool,
    applied: tokio::sync::Mutex<Applied<M>>,
    control: TargetControl,
    shutdown: CancellationToken,
    metrics: ReloadMetrics,
}

#[async_trait]
impl<M> Reload for ConfigReloader<M>
where
    M: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Send + Sync + 'static,
{
    async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        if self.shutdown.is_cancelled() {
            return Err(ReloadError::ShuttingDown);
        }
        // Serializes reloads: each one compares with what the previous one applied.
        let mut applied = self.applied.lock().await;
        if self.shutdown.is_cancelled() {
            return Err(ReloadError::ShuttingDown);
        }
        let result = self.reload_from(&mut applied).await;
        match &result {
            Ok(r) => {
                self.metrics.record(true);
                tracing::info!(
                    added = ?r.added, changed = ?r.changed, removed = ?r.removed, unchanged = r.unchanged.len(),
                    "configuration reloaded"
                );
            }
            Err(ReloadError::ShuttingDown) => {}
            Err(e) => {
                self.metrics.record(false);
                tracing::error!(config = %self.path.display(), error = %e, "configuration not reloaded; the running one is kept");
            }
        }
        result
    }
}

impl<M> ConfigReloader<M>
where
    M: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Send + Sync + 'static,
{
    /// A reloader of the file at `path`, whose `config` (with `targets`, the settings it
    /// gave) is in force and applied through `control`; `listen_flag` when the process
    /// was given its own listen address (the file's may then change).
    pub fn new(
        path: PathBuf,
        listen_flag: bool,
        config: Config<M>,
        targets: &[(ProbeSettings, TargetSchedule)],
        control: TargetControl,
        shutdown: CancellationToken,
        metrics: ReloadMetrics,
    ) -> Self {
        let applied = tokio::sync::Mutex::new(Applied::new(config, targets));
        Self { path, listen_flag, applied, control, shutdown, metrics }
    }

    async fn reload_from(&self, applied: &mut Applied<M>) -> Result<ReloadReport, ReloadError> {
        let new = Config::<M>::load(&self.path)?;
        let old = &applied.config;
        if !self.listen_flag && new.listen != old.listen {
            return Err(ReloadError::RequiresRestart { field: "listen".into() });
        }
        if new.state_file != old.state_file {
            return Err(ReloadError::RequiresRestart { field: "state_file".into() });
        }
        if new.monitor != old.monitor {
            return Err(ReloadError::RequiresRestart { field: "monitor".into() });
        }
        if new.max_concurrent_cycles != old.max_concurrent_cycles {
            return Err(ReloadError::RequiresRestart { field: "max_concurrent_cycles".into() });
        }
        // Every key variable is read now: one unset refuses the whole reload.
        let targets = new.probe_targets()?;
        let (changes, report) = plan(old, &applied.keys, &new, &targets);
        let positions: HashMap<&str, usize> =
            new.targets.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
        self.control.apply(changes).await.map_err(|e| match e {
            ControlError::Stopped => ReloadError::ShuttingDown,
            ControlError::Target { name, source } => ReloadError::Invalid {
                field: format!("targets[{}]", positions.get(name.as_str()).copied().unwrap_or_default()),
                message: source.to_string(),
            },
        })?;
        *applied = Applied::new(new, &targets);
        Ok(report)
    }
}

/// What to change to go from `old` (whose targets held `old_keys`) to `new`, whose
/// settings are `targets` (in `new.targets`' order).
fn plan<M>(
    old: &Config<M>,
    old_keys: &HashMap<String, String>,
    new: &Config<M>,
    targets: &[(ProbeSettings, TargetSchedule)],
) -> (TargetChanges, ReloadReport) {
    let mut changes = TargetChanges::default();
    let mut report = ReloadReport::default();
    for (config, (settings, schedule)) in new.targets.iter().zip(targets) {
        let name = config.name.clone();
        match old.targets.iter().find(|t| t.name == name) {
            Some(before) if before == config && old_keys.get(&name) == Some(&settings.api_key) => {
                report.unchanged.push(name)
            }
            Some(_) => {
                changes.start_or_update.push((settings.clone(), schedule.clone()));
                report.changed.push(name);
            }
            None => {
                changes.start_or_update.push((settings.clone(), schedule.clone()));
                report.added.push(name);
            }
        }
    }
    for before in &old.targets {
        if !new.targets.iter().any(|t| t.name == before.name) {
            changes.remove.push(before.name.clone());
            report.removed.push(before.name.clone());
        }
    }
    (changes, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::engine::runtime::target_control;

    const ONE: &str = r#"
state_file = "/tmp/lockprobe-serve-reload-unit.json"

[[targets]]
name = "NAME"
instances = ["http://127.0.0.1:9"]
api_key_env = "PATH"
test_prefix = "probe-"
cache_ttl = "1s"
replication_bound = "500ms"
buffer = "BUFFER"
schedule = "0 0 0 1 1 * 2099"
timeout = "5m"
"#;

    fn config(targets: &[(&str, &str)]) -> Config {
        let mut text = ONE.split("[[targets]]").next().unwrap().to_owned();
        for (name, buffer) in targets {
            let target = ONE.split("[[targets]]").nth(1).unwrap();
            text.push_str(&format!("[[targets]]{}", target.replace("NAME", name).replace("BUFFER", buffer)));
        }
        text.parse().unwrap()
    }

    /// Every target's settings, with `key` as its key (the file names `PATH`, a variable
    /// every test process has, so nothing needs setting).
    fn settings(config: &Config, key: &str) -> Vec<(ProbeSettings, TargetSchedule)> {
        let mut targets = config.probe_targets().unwrap();
        for (settings, _) in &mut targets {
            settings.api_key = key.to_owned();
        }
        targets
    }

    #[test]
    fn a_plan_tells_added_changed_removed_and_unchanged_targets_apart() {
        let old = config(&[("a", "1s"), ("b", "1s"), ("c", "1s")]);
        let keys = settings(&old, "k").iter().map(|(s, _)| (s.name.clone(), s.api_key.clone())).collect();
        let new = config(&[("a", "1s"), ("c", "2s"), ("d", "1s")]);
        let (changes, report) = plan(&old, &keys, &new, &settings(&new, "k"));
        assert_eq!(report.unchanged, ["a"]);
        assert_eq!(report.changed, ["c"]);
        assert_eq!(report.added, ["d"]);
        assert_eq!(report.removed, ["b"]);
        let started: Vec<&str> = changes.start_or_update.iter().map(|(s, _)| s.name.as_str()).collect();
        assert_eq!(started, ["c", "d"]);
        assert_eq!(changes.remove, ["b"]);
        // The same fields with another key (a rotated key file) is a change.
        let (_, report) = plan(&old, &keys, &old, &settings(&old, "rotated"));
        assert_eq!(report.changed, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_changed_cycle_cap_needs_a_restart_and_a_bad_one_is_invalid_naming_it() {
        let old = config(&[("a", "1s")]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockprobe.toml");
        let (control, _inbox) = target_control();
        let reloader = ConfigReloader {
            path: path.clone(),
            listen_flag: false,
            applied: tokio::sync::Mutex::new(Applied::new(old.clone(), &settings(&old, "k"))),
            control,
            shutdown: CancellationToken::new(),
            metrics: ReloadMetrics::new(&prometheus::Registry::new()).unwrap(),
        };
        let text = ONE.replace("NAME", "a").replace("BUFFER", "1s");
        std::fs::write(&path, format!("max_concurrent_cycles = 10\n{text}")).unwrap();
        let e = reloader.reload().await.unwrap_err();
        assert_eq!(e, ReloadError::RequiresRestart { field: "max_concurrent_cycles".into() });
        std::fs::write(&path, format!("max_concurrent_cycles = 0\n{text}")).unwrap();
        let e = reloader.reload().await.unwrap_err();
        assert_eq!(e.kind(), "config-invalid");
        assert_eq!(e.field(), Some("max_concurrent_cycles"), "{e}");
    }

    #[tokio::test]
    async fn a_reload_during_shutdown_is_refused_and_does_not_count_as_a_failure() {
        let old = config(&[("a", "1s")]);
        let (control, _inbox) = target_control();
        let shutdown = CancellationToken::new();
        let registry = prometheus::Registry::new();
        let reloader = ConfigReloader {
            path: PathBuf::from("/nonexistent/lockprobe.toml"),
            listen_flag: false,
            applied: tokio::sync::Mutex::new(Applied::new(old.clone(), &settings(&old, "k"))),
            control,
            shutdown: shutdown.clone(),
            metrics: ReloadMetrics::new(&registry).unwrap(),
        };
        // Before shutdown the missing file is a refusal, counted.
        assert!(matches!(reloader.reload().await, Err(ReloadError::Unreadable(_))));
        assert!(crate::exposition::render(&registry).contains("lockprobe_config_last_reload_successful 0"));
        reloader.metrics.record(true);
        shutdown.cancel();
        assert_eq!(reloader.reload().await, Err(ReloadError::ShuttingDown));
        assert!(crate::exposition::render(&registry).contains("lockprobe_config_last_reload_successful 1"));
    }
}
