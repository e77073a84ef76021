//! Every server the package runs accepts through `lockprobe::listener`: a slowloris of
//! half-sent requests holds a connection only until the header-read timeout, never more
//! connections than the cap are served at once, and the service stays reachable through
//! it all. Driven over real sockets against the reference service; `serve`, `monitor`
//! and `demo` take the same path (`tests/serve_cli.rs` and `tests/service_cli.rs` check
//! their flags).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::listener::{open_connections, Limits};
use lockprobe::service::{start, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::LocationStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const CAP: usize = 30;

/// `open_connections` counts every listener of the process: the tests here take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const TIMEOUT: Duration = Duration::from_secs(1);

async fn service(limits: Limits) -> (String, CancellationToken) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let shutdown = CancellationToken::new();
    let config = ServiceConfig { limits, max_body_bytes: 1024, ..ServiceConfig::new("k") };
    let running = start(config, store, clock, vec!["127.0.0.1:0".parse().unwrap()], shutdown.clone()).await.unwrap();
    (running.addrs[0].to_string(), shutdown)
}

/// Opens a connection and sends a request head that never ends.
async fn half_sent(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    s
}

/// Waits for the server to close `s` (end of stream or reset), up to `within`.
async fn closed_by_server(mut s: TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {} // a response (hyper may answer 408-less): keep reading to the close
        }
    }
}

/// Sends `request` on a fresh connection and reads until the server closes it, for at
/// most 10 s: whether it closed, and what came back, lower-cased. The server may answer
/// and close before it has read everything sent, so a write cut short is no error.
async fn exchange(addr: &str, request: &str) -> (bool, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request.as_bytes()).await;
    let mut response = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut response)).await.is_ok();
    (closed, String::from_utf8_lossy(&response).to_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_holds_a_connection_only_until_the_header_timeout_and_never_more_than_the_cap() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, shutdown) =
        service(Limits { header_read_timeout: TIMEOUT, max_connections: CAP, ..Limits::default() }).await;
    let http = reqwest::Client::new();
    let healthz = format!("http://{addr}/healthz");
    assert_eq!(http.get(&healthz).send().await.unwrap().status(), 200);

    // Four times the cap of half-sent requests: the kernel completes every handshake
    // (the backlog), the server takes on CAP of them at a time.
    let mut slow = Vec::new();
    for _ in 0..4 * CAP {
        slow.push(half_sent(&addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = open_connections();
    assert!(open <= CAP, "{open} connections served at once, cap {CAP}");

    // The service answers through the flood: the slow connections are dropped at the
    // timeout, a batch at a time, and the health check's turn comes.
    let started = Instant::now();
    let answered = http.get(&healthz).timeout(Duration::from_secs(20)).send().await.unwrap();
    assert_eq!(answered.status(), 200);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(15), "healthz waited {waited:?}");

    // Every half-sent request is closed by the server: none is held for good.
    let mut held = 0;
    for s in slow {
        if !closed_by_server(s, Duration::from_secs(15)).await {
            held += 1;
        }
    }
    assert_eq!(held, 0, "half-sent requests still open");
    shutdown.cancel();
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_a_prompt_one_is_served() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, shutdown) = service(Limits { header_read_timeout: TIMEOUT, ..Limits::default() }).await;
    // Nothing sent at all: closed after the timeout, not before half of it.
    let started = Instant::now();
    let idle = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_by_server(idle, Duration::from_secs(10)).await);
    assert!(started.elapsed() >= TIMEOUT / 2, "{:?}", started.elapsed());

    // A request head sent at once is answered, the connection kept alive for the next.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    shutdown.cancel();
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_as_problem_json_whatever_its_framing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, shutdown) = service(Limits::default()).await;
    let path = "/v1/resources/r1/lock";
    let big = format!("{{\"owner\":\"{}\"}}", "o".repeat(4096));
    // Announced (Content-Length) and streamed (chunked: no length up front).
    let mut chunked = String::new();
    for chunk in big.as_bytes().chunks(512) {
        chunked += &format!("{:x}\r\n{}\r\n", chunk.len(), String::from_utf8_lossy(chunk));
    }
    chunked += "0\r\n\r\n";
    let head = |framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n\
             Connection: close\r\n{framing}\r\n"
        )
    };
    let requests =
        [head(&format!("Content-Length: {}\r\n", big.len())) + &big, head("Transfer-Encoding: chunked\r\n") + &chunked];
    for request in requests {
        let (_, text) = exchange(&addr, &request).await;
        assert!(text.starts_with("http/1.1 413"), "{text}");
        assert!(text.contains("content-type: application/problem+json"), "{text}");
        assert!(text.contains("urn:lockprobe:error:payload-too-large"), "{text}");
    }
    shutdown.cancel();
}

/// What the HTTP layer answers itself, before any handler, as docs/contract.md
/// ("Connections") lists it: the status, an empty body, and the connection closed.
#[tokio::test]
async fn errors_below_the_handlers_are_the_ones_the_contract_lists() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (addr, shutdown) = service(Limits::default()).await;
    let long = "a".repeat(70_000);
    for (request, status) in [
        (format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {long}\r\n\r\n"), "431"),
        (format!("GET /{long} HTTP/1.1\r\nHost: x\r\n\r\n"), "431"),
        ("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x7fb\r\n\r\n".to_owned(), "400"),
        ("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_owned(), "400"),
    ] {
        let (closed, text) = exchange(&addr, &request).await;
        assert!(closed, "{status}: the connection was not closed");
        assert!(text.starts_with(&format!("http/1.1 {status}")), "{status}: {text}");
        assert!(text.contains("content-length: 0"), "{status}: {text}");
    }
    // A head just under the limit is served.
    let under = "a".repeat(60_000);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {under}\r\nConnection: close\r\n\r\n");
    let (closed, text) = exchange(&addr, &request).await;
    assert!(closed && text.starts_with("http/1.1 200"), "{text:.200}");
    shutdown.cancel();
}
