//! The probe's state file: every lock it is about to take or holds, written before it acts
//! on the lock, so a probe that was killed releases what it left behind on its next start.
//! Written atomically (temp file + rename) with mode 0600, since it holds lock tokens.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// State file failures.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing the file failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The state file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file exists but is not ours.
    #[error("state file {path} is not valid: {message}")]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
}

/// One lock the probe holds or is about to take.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldLock {
    /// Target name.
    pub target: String,
    /// Resource id.
    pub resource: String,
    /// Lock token; `None` between recording the intent and the service's answer.
    pub token: Option<String>,
    /// The pre-lock as it is (or was) sent, with its idempotency key: repeating it
    /// returns the token of a pre-lock whose answer never arrived (absent in files of
    /// earlier versions, and for locks taken without a journaled request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_lock: Option<PreLockIntent>,
    /// When the entry was recorded.
    pub recorded_at: DateTime<Utc>,
}

/// A pre-lock request as the probe sends it, journaled before sending.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreLockIntent {
    /// The `Idempotency-Key` it is sent with.
    pub key: String,
    /// `owner`.
    pub owner: String,
    /// `durationSeconds`.
    pub duration_seconds: f64,
    /// `targetLocation`, if any.
    pub target_location: Option<String>,
}

impl std::fmt::Debug for HeldLock {
    // Hand-written so a token never reaches a log line through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("target", &self.target)
            .field("resource", &self.resource)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("pre_lock", &self.pre_lock.as_ref().map(|_| "<journaled>"))
            .field("recorded_at", &self.recorded_at)
            .finish()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateDoc {
    locks: Vec<HeldLock>,
}

/// Entries by (target, resource): a change touches one entry, and a target's entries
/// are one range. A list scanned, shifted and cloned whole on every change cost a
/// quarter of the CPU of 1,000 targets' cycles (BENCHMARKS.md, "Probe engine at scale").
type Locks = BTreeMap<(String, String), HeldLock>;

/// The state file, or an in-memory stand-in when none is configured.
#[derive(Debug)]
pub struct StateFile {
    path: Option<PathBuf>,
    locks: Mutex<Locks>,
    /// Why the last write failed; `None` once a write succeeds. A pre-lock is sent only
    /// after its intent is journaled, so while this holds, cycles lock nothing.
    write_failure: Mutex<Option<String>>,
}

fn key(target: &str, resource: &str) -> (String, String) {
    (target.to_owned(), resource.to_owned())
}

impl StateFile {
    /// Opens (or starts) the state file at `path`, keeping entries a previous run left.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let list = match std::fs::read(path) {
            Ok(bytes) if bytes.is_empty() => Vec::new(),
            Ok(bytes) => {
                serde_json::from_slice::<StateDoc>(&bytes)
                    .map_err(|e| StateError::Corrupt { path: path.to_path_buf(), message: e.to_string() })?
                    .locks
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(StateError::Io { path: path.to_path_buf(), source }),
        };
        let locks = list.into_iter().map(|l| (key(&l.target, &l.resource), l)).collect();
        Ok(Self { path: Some(path.to_path_buf()), locks: Mutex::new(locks), write_failure: Mutex::new(None) })
    }

    /// A state that lives only in memory (nothing survives a kill).
    pub fn in_memory() -> Self {
        Self { path: None, locks: Mutex::new(Locks::new()), write_failure: Mutex::new(None) }
    }

    /// Checks that the state file at `path` can be written the way every change writes
    /// it (a temporary file beside it, renamed over it), without changing it: for
    /// `check-config` and the start of `serve`, so that a probe that could not journal a
    /// lock refuses to start rather than lock without its journal.
    pub fn check_writable(path: &Path) -> Result<(), StateError> {
        let io = |source| StateError::Io { path: path.to_path_buf(), source };
        let tmp = temp_path(path);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        match opts.open(&tmp) {
            Ok(file) => {
                drop(file);
                std::fs::remove_file(&tmp).map_err(io)
            }
            // A temporary file left by a write that died halfway: writable if it is a
            // file (the next write truncates it), not if it is anything else.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let left = std::fs::symlink_metadata(&tmp).map_err(io)?;
                if left.is_file() {
                    std::fs::OpenOptions::new().write(true).open(&tmp).map(drop).map_err(io)
                } else {
                    Err(io(std::io::Error::other(format!("{} is in the way and is not a file", tmp.display()))))
                }
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Why the last write of the state file failed, if it did (none since a write
    /// succeeded). While it holds, every pre-lock is refused before it is sent.
    pub fn write_failure(&self) -> Option<String> {
        self.write_failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The entries, waited for off the runtime: a writer holds them while the disk
    /// syncs.
    fn locks(&self) -> std::sync::MutexGuard<'_, Locks> {
        off_the_runtime(|| self.locks_here())
    }

    fn locks_here(&self) -> std::sync::MutexGuard<'_, Locks> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries currently recorded.
    pub fn entries(&self) -> Vec<HeldLock> {
        self.locks().values().cloned().collect()
    }

    /// Entries currently recorded for `target`.
    pub fn entries_of(&self, target: &str) -> Vec<HeldLock> {
        let locks = self.locks();
        let from = (target.to_owned(), String::new());
        locks.range(from..).take_while(|((t, _), _)| t == target).map(|(_, l)| l.clone()).collect()
    }

    /// Records that the probe is about to pre-lock `resource` of `target`, with the
    /// request it will send (and its idempotency key) when there is one to repeat.
    ///
    /// The caller sends the pre-lock only if this succeeds: a lock the journal does not
    /// hold would not be released by a restart. On failure the entry is not kept in
    /// memory either (nothing will be sent for it), and whatever it replaced is back.
    pub fn record_intent(
        &self,
        target: &str,
        resource: &str,
        pre_lock: Option<PreLockIntent>,
    ) -> Result<(), StateError> {
        let mut replaced = None;
        let recorded = self.update(|locks| {
            let held = HeldLock {
                target: target.to_string(),
                resource: resource.to_string(),
                token: None,
                pre_lock,
                recorded_at: Utc::now(),
            };
            replaced = Some(locks.insert(key(target, resource), held));
        });
        if recorded.is_err() {
            let mut locks = self.locks();
            match replaced.flatten() {
                Some(previous) => locks.insert(key(target, resource), previous),
                None => locks.remove(&key(target, resource)),
            };
        }
        recorded
    }

    /// Records the token the service issued for `resource` of `target`.
    pub fn record_token(&self, target: &str, resource: &str, token: &str) -> Result<(), StateError> {
        self.update(|locks| {
            let key = key(target, resource);
            let pre_lock = locks.get(&key).and_then(|l| l.pre_lock.clone());
            let held = HeldLock {
                target: target.to_string(),
                resource: resource.to_string(),
                token: Some(token.to_string()),
                pre_lock,
                recorded_at: Utc::now(),
            };
            locks.insert(key, held);
        })
    }

    /// Forgets `resource` of `target` (lock released, swapped or never taken).
    pub fn forget(&self, target: &str, resource: &str) -> Result<(), StateError> {
        self.update(|locks| {
            locks.remove(&key(target, resource));
        })
    }

    fn update(&self, f: impl FnOnce(&mut Locks)) -> Result<(), StateError> {
        off_the_runtime(|| {
            // The mutex is held across the write so concurrent cycles never interleave
            // files.
            let mut locks = self.locks_here();
            f(&mut locks);
            if let Some(path) = &self.path {
                let written = write_atomically(path, &StateDoc { locks: locks.values().cloned().collect() });
                *self.write_failure.lock().unwrap_or_else(|e| e.into_inner()) =
                    written.as_ref().err().map(ToString::to_string);
                written?;
            }
            Ok(())
        })
    }
}

/// Runs `f`, which may wait on the disk (a write and its fsync, or the lock a writer
/// holds meanwhile), without stalling the async runtime: on a multi-threaded runtime the
/// worker first hands its other tasks to another thread, so a slow or stalled disk
/// holds up the cycles that journal and never `/metrics`, `/healthz` or the scheduler.
/// Elsewhere (a current-thread runtime, a plain thread) `f` just runs.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Where a write puts the new file before renaming it over `path`.
fn temp_path(path: &Path) -> PathBuf {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    PathBuf::from(tmp_name)
}

fn write_atomically(path: &Path, doc: &StateDoc) -> Result<(), StateError> {
    let io = |source| StateError::Io { path: path.to_path_buf(), source };
    let bytes = serde_json::to_vec_pretty(doc).map_err(|e| io(std::io::Error::other(e)))?;
    let tmp = temp_path(path);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut file = opts.open(&tmp).map_err(io)?;
    file.write_all(&bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn intent_then_token_then_forget_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let s = StateFile::open(&path).unwrap();
        let intent =
            PreLockIntent { key: "k1".into(), owner: "o".into(), duration_seconds: 60.0, target_location: None };
        s.record_intent("demo", "probe-0001", Some(intent.clone())).unwrap();
        let journaled = StateFile::open(&path).unwrap().entries();
        assert_eq!(journaled[0].token, None);
        assert_eq!(
            journaled[0].pre_lock.as_ref().map(|p| p.key.as_str()),
            Some("k1"),
            "the key is on disk before the call"
        );
        s.record_token("demo", "probe-0001", "secret").unwrap();
        s.record_intent("demo", "probe-0002", None).unwrap();
        let reopened = StateFile::open(&path).unwrap().entries();
        assert_eq!(reopened.len(), 2);
        assert_eq!(reopened[0].token.as_deref(), Some("secret"));
        assert!(reopened[0].pre_lock == Some(intent), "the journaled request stays with the token");
        s.forget("demo", "probe-0001").unwrap();
        let reopened = StateFile::open(&path).unwrap().entries();
        assert_eq!(reopened.len(), 1);
        assert_eq!(reopened[0].resource, "probe-0002");
        assert!(!dir.path().join("state.json.tmp").exists());
    }

    #[cfg(unix)]
    #[test]
    fn file_mode_is_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let s = StateFile::open(&path).unwrap();
        s.record_token("demo", "probe-0001", "secret").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn debug_output_never_shows_the_token() {
        let s = StateFile::in_memory();
        s.record_token("demo", "probe-0001", "secret-token").unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret-token") && shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn a_state_file_of_an_earlier_version_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let old =
            r#"{"locks":[{"target":"demo","resource":"probe-0001","token":null,"recordedAt":"2026-01-01T00:00:00Z"}]}"#;
        std::fs::write(&path, old).unwrap();
        let entries = StateFile::open(&path).unwrap().entries();
        assert_eq!(entries.len(), 1);
        assert!(entries[0].pre_lock.is_none());
    }

    #[test]
    fn a_targets_entries_are_its_own_only() {
        let s = StateFile::in_memory();
        for (target, resource) in [("a", "p1"), ("ab", "p1"), ("b", "p2"), ("a", "p2"), ("", "p3")] {
            s.record_intent(target, resource, None).unwrap();
        }
        let of = |t: &str| s.entries_of(t).into_iter().map(|l| (l.target, l.resource)).collect::<Vec<_>>();
        assert_eq!(of("a"), [("a".to_owned(), "p1".to_owned()), ("a".to_owned(), "p2".to_owned())]);
        assert_eq!(of("ab").len(), 1);
        assert!(of("c").is_empty());
        s.forget("a", "p1").unwrap();
        assert_eq!(of("a").len(), 1);
        assert_eq!(s.entries().len(), 4);
    }

    /// A write that cannot land (here a directory where the temporary file goes, as a
    /// careless operator or a full volume leaves it): the intent is refused and not kept,
    /// the failure is remembered until a write succeeds, and `check_writable` says so
    /// before anything is written.
    #[test]
    fn an_intent_that_cannot_be_journaled_is_refused_and_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        StateFile::check_writable(&path).unwrap();
        assert!(!dir.path().join("state.json.tmp").exists(), "the check leaves nothing behind");
        let s = StateFile::open(&path).unwrap();
        s.record_token("demo", "probe-0002", "kept").unwrap();
        std::fs::create_dir(dir.path().join("state.json.tmp")).unwrap();

        let refused = s.record_intent("demo", "probe-0001", None).unwrap_err();
        assert!(refused.to_string().contains("state.json"), "{refused}");
        let failure = s.write_failure().expect("the failure is remembered");
        assert!(failure.contains("state.json"), "{failure}");
        let held: Vec<String> = s.entries().into_iter().map(|l| l.resource).collect();
        assert_eq!(held, ["probe-0002"], "the refused intent is not kept in memory");
        let err = StateFile::check_writable(&path).unwrap_err().to_string();
        assert!(err.contains("state.json.tmp") && err.contains("not a file"), "{err}");
        // Replacing an entry that cannot be written keeps the one it would replace.
        assert!(s.record_intent("demo", "probe-0002", None).is_err());
        assert_eq!(s.entries()[0].token.as_deref(), Some("kept"));

        std::fs::remove_dir(dir.path().join("state.json.tmp")).unwrap();
        s.record_intent("demo", "probe-0001", None).unwrap();
        assert_eq!(s.write_failure(), None, "a write that lands clears it");
        assert_eq!(StateFile::open(&path).unwrap().entries().len(), 2);
        // A missing directory is refused as well.
        assert!(StateFile::check_writable(&dir.path().join("gone/state.json")).is_err());
    }

    /// A stalled disk (here the write's temporary file is a FIFO nobody reads, so
    /// opening it for writing waits) holds up the journaling task only: another task on
    /// the same single worker keeps running.
    #[cfg(unix)]
    #[test]
    fn a_stalled_write_does_not_stall_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let state = std::sync::Arc::new(StateFile::open(&path).unwrap());
        let made = std::process::Command::new("mkfifo").arg(temp_path(&path)).status().unwrap();
        assert!(made.success());
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // Queued in this order on the one worker: the write first, then the other task.
        let writer = runtime.spawn({
            let state = state.clone();
            async move { state.record_intent("t", "probe-1", None) }
        });
        let (ran, heard) = std::sync::mpsc::channel();
        runtime.spawn(async move { ran.send(()) });
        let other_ran = heard.recv_timeout(Duration::from_secs(10)).is_ok();
        // The disk answers (a FIFO takes the bytes, then refuses the fsync), before any
        // assertion, so a failing run ends instead of leaving a worker blocked.
        let drained = std::fs::read(temp_path(&path)).map(|b| b.len());
        assert!(other_ran, "a task beside a stalled journal write never ran");
        assert!(drained.unwrap() > 0, "the write was waiting on the disk");
        let written = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), writer).await });
        assert!(matches!(written, Ok(Ok(_))), "the write ends once the disk answers");
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "not json").unwrap();
        assert!(matches!(StateFile::open(&path), Err(StateError::Corrupt { .. })));
    }
}
