//! What an operator gets from every process: `--log-format json` (one JSON object per log
//! line on stderr; a bad value is a usage error) and `lockprobe_build_info` plus the
//! process metrics on `/metrics`, here from `lockprobe monitor` alone.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn json_logs_build_info_and_process_metrics_from_the_monitor_alone() {
    let mut child = Kill(
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["monitor", "--log-format", "json", "--listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = BufReader::new(child.0.stdout.take().unwrap());
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let listening = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("lockprobe monitor: listening on ").map(str::to_owned));
    let base = listening.expect("the monitor prints its address");

    // Every log line is one JSON object with a level and the message in `fields`.
    let line = rx.recv_timeout(Duration::from_secs(20)).expect("a log line");
    let log: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(log["level"], "INFO", "{log}");
    assert!(log["fields"]["message"].is_string(), "{log}");

    let text = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap() });
    assert!(text.contains(&format!("lockprobe_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
    #[cfg(target_os = "linux")]
    for name in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"] {
        assert!(text.contains(&format!("\n{name} ")), "no {name} in\n{text}");
    }

    let bad = Command::new(env!("CARGO_BIN_EXE_lockprobe")).args(["monitor", "--log-format", "xml"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-format"), "{}", String::from_utf8_lossy(&bad.stderr));
}
