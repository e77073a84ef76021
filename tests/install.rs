//! `cargo install --locked --path .`, the README's first command, checked as a reader would
//! run it: installed (`--debug`, into a temporary `--root`) and the installed binary run.
//!
//! The install shares this suite's target directory, so cargo reuses what the suite has
//! built: 0.4 to 0.6 s on a warm target directory (2026-12-04, 2 cores). Not nothing on a
//! cold one: without the dev-dependencies a few dependencies resolve with fewer features
//! (tokio without `test-util`, serde, regex-automata, zerocopy, crossbeam-utils), so the
//! first install builds those and what stands on them (50 of its 319 units, the crate
//! itself included) once more: 110 s of compilation summed over those units (timings of a
//! one-job build), about a minute and a half on a fresh clone, as CI's.
//!
//! `cargo test` releases the build directory's lock before it runs the tests, so the nested
//! `cargo install` does not wait on it. Cargo does copy the binary it installs into the
//! target directory's `debug/lockprobe`, the `CARGO_BIN_EXE_lockprobe` of every other test
//! binary; this test puts the suite's own build back there when it is done (and is alone in
//! its binary, so no test runs that file meanwhile).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The target directory this test was built in, wherever `CARGO_TARGET_DIR` (or
/// `build.target-dir`) put it: `CARGO_TARGET_TMPDIR` is its `tmp/`.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.parent().unwrap_or_else(|| panic!("{} has no parent", tmp.display())).to_path_buf();
    let bin = Path::new(env!("CARGO_BIN_EXE_lockprobe"));
    assert_eq!(
        bin.parent(),
        Some(dir.join("debug").as_path()),
        "the suite's binary is not in {}/debug: a --target or --profile build, which cargo install --debug cannot reuse",
        dir.display()
    );
    dir
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn run(what: &str, command: &mut Command) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(out.status.success(), "{what} failed ({}):\n{}", out.status, text(&out));
    out
}

/// Puts the suite's own `debug/lockprobe` back when dropped (after `cargo install` has
/// replaced it with the build it installed), by an atomic rename of a hard link kept aside.
struct KeepSuiteBinary {
    kept: PathBuf,
    bin: PathBuf,
}

impl KeepSuiteBinary {
    fn new(aside: &Path) -> Self {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_lockprobe"));
        let kept = aside.join("suite-lockprobe");
        if std::fs::hard_link(&bin, &kept).is_err() {
            std::fs::copy(&bin, &kept).unwrap_or_else(|e| panic!("cannot keep {} aside: {e}", bin.display()));
        }
        KeepSuiteBinary { kept, bin }
    }
}

impl Drop for KeepSuiteBinary {
    fn drop(&mut self) {
        if let Err(e) = std::fs::rename(&self.kept, &self.bin) {
            eprintln!("cannot put {} back: {e}", self.bin.display());
        }
    }
}

#[test]
fn cargo_install_gives_a_working_lockprobe() {
    let target = target_dir();
    let scratch = tempfile::Builder::new().prefix("install-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let install_root = scratch.path().join("root");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let suite_binary = || std::fs::metadata(env!("CARGO_BIN_EXE_lockprobe")).ok().map(|m| (m.len(), m.modified().ok()));
    let before = suite_binary();
    let started = Instant::now();
    let installed = {
        let _suite_binary = KeepSuiteBinary::new(scratch.path());
        Command::new(&cargo)
            .args(["install", "--locked", "--offline", "--debug", "--path"])
            .arg(root())
            .arg("--root")
            .arg(&install_root)
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"))
    };
    let took = started.elapsed();
    assert!(installed.status.success(), "cargo install failed ({}):\n{}", installed.status, text(&installed));
    eprintln!("cargo install --debug into {} took {:.1} s", install_root.display(), took.as_secs_f64());
    assert_eq!(suite_binary(), before, "the suite's own debug/lockprobe was not put back");

    let lockprobe = install_root.join("bin/lockprobe");
    assert!(lockprobe.is_file(), "cargo install left no {}:\n{}", lockprobe.display(), text(&installed));

    let version = run("lockprobe --version", Command::new(&lockprobe).arg("--version"));
    let version = String::from_utf8_lossy(&version.stdout);
    let expected = format!("lockprobe {} (", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&expected), "`lockprobe --version` said {version:?}, not {expected}...");

    let help = run("lockprobe --help", Command::new(&lockprobe).arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout);
    for command in ["demo", "service", "validate", "gate", "serve", "monitor", "check-config"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(command)),
            "`lockprobe --help` lists no {command}:\n{help}"
        );
    }

    let config = root().join("deploy/kubernetes/lockprobe.toml");
    run(
        "the installed lockprobe check-config deploy/kubernetes/lockprobe.toml",
        Command::new(&lockprobe).arg("check-config").arg(&config).env("ORDERS_LOCK_API_KEY", "placeholder"),
    );
}
