//! The one accept path of every HTTP server the package runs (the reference service,
//! `serve`, `monitor`, `demo`), with bounds `axum::serve` has no knob for.
//!
//! - **Connections are capped** ([`Limits::max_connections`], and never above the
//!   process's file-descriptor limit less a reserve for the store's own sockets): at the
//!   cap the server stops accepting, so further clients wait in the kernel's backlog
//!   instead of exhausting descriptors ("Too many open files" took every instance down,
//!   `/healthz` included).
//! - **Request heads must arrive in time** ([`Limits::header_read_timeout`]): a client
//!   that opens a connection and sends its head slowly, or never, or idles between
//!   requests, is disconnected, so a slowloris holds a slot for at most that long.
//! - **Request bodies and heads are bounded** ([`Limits::max_request_body`] on every body,
//!   whatever the handler reads it with; heads at 64 KiB): 413 and 431.
//! - **TLS handshakes** run inside the connection's slot, under the same timeout as a
//!   request head.
//! - **Memory returns after a flood**: the allocator is asked to give freed pages back once
//!   the connections of a flood have closed (RELIABILITY.md, "A flood of half-sent
//!   requests", has the measurement).
//! - **TLS and basic authentication** come from a [`Guards`]: none, the reference
//!   service's TLS flags, or a web configuration file that is re-read when it changes
//!   ([`web_config`]). A connection's TLS is what was in force when it was accepted; its
//!   every request is checked against the users in force when it arrives.
//!
//! Errors hyper answers itself, before any handler runs (a malformed request line or
//! header: 400; a head over the limit, a long request target included: 431; both with an
//! empty body), cannot be shaped into problem+json; docs/contract.md lists them.

pub mod basic_auth;
pub mod tls;
pub mod web_config;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// File descriptors left to the rest of the process (store connections, files, the
/// listener itself) when the connection cap is derived from the descriptor limit.
const DESCRIPTOR_RESERVE: u64 = 256;

/// The largest request head hyper buffers (request line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The bounds of one listener (the flags of every command that listens set them:
/// `app::listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a request's head (its request line and
    /// headers), counted from the connection's start or the end of its previous
    /// response; a connection idle for as long is closed too, and a TLS handshake gets
    /// as long again.
    pub header_read_timeout: Duration,
    /// Connections served at once. At the cap the server stops accepting until one
    /// closes; never more than the process's file-descriptor limit less 256.
    pub max_connections: usize,
    /// The largest request body, in bytes (413 above it). Not a flag of its own: the
    /// service bounds bodies with its `--max-body-bytes`, and the other servers take
    /// none worth more than this default.
    pub max_request_body: usize,
}

/// The body limit of servers that take no bodies of their own (`serve`, `monitor`).
const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 16_384,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
        }
    }
}

/// A limit that cannot work, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct LimitsError {
    /// The field, e.g. `header_read_timeout` (its flag is the same with dashes).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl Limits {
    /// Refuses limits that would leave the server unable to serve.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let refuse = |field, reason: &str| Err(LimitsError { field, reason: reason.to_owned() });
        if self.header_read_timeout < Duration::from_millis(100) {
            return refuse("header_read_timeout", "must be at least 100ms (no client sends a request head faster)");
        }
        if self.header_read_timeout > Duration::from_secs(300) {
            return refuse(
                "header_read_timeout",
                "must be at most 5m (a longer one lets a slow client hold a connection)",
            );
        }
        if self.max_connections == 0 {
            return refuse("max_connections", "must be at least 1");
        }
        Ok(())
    }

    /// The connection cap in force: the configured one, lowered to fit the process's
    /// file-descriptor limit.
    pub fn effective_connections(&self) -> usize {
        match descriptor_limit() {
            Some(limit) => {
                let room = usize::try_from(limit.saturating_sub(DESCRIPTOR_RESERVE)).unwrap_or(usize::MAX).max(1);
                self.max_connections.min(room)
            }
            None => self.max_connections,
        }
    }
}

/// The process's soft limit on open file descriptors, when it has one.
fn descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (got == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// What a connection and its requests must pass before they reach the app.
#[derive(Clone, Default)]
pub struct Guard {
    /// TLS first, when set.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// When set, every request but [`UNGUARDED_PATHS`] needs HTTP basic authentication
    /// as one of these users.
    pub users: Option<Arc<basic_auth::BasicAuthUsers>>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.as_ref().map(|u| u.len()))
            .field("headers", &self.headers)
            .finish()
    }
}

/// Paths answered without basic authentication: a liveness or readiness check (a
/// kubelet's, a load balancer's) carries no credentials, and their answers say no more
/// than whether the process is up. TLS, when on, still applies to them.
pub const UNGUARDED_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The [`Guard`] in force for a listener: fixed, or replaced as a web configuration
/// changes.
#[derive(Clone, Debug)]
pub struct Guards(watch::Receiver<Arc<Guard>>);

impl Guards {
    /// Plain HTTP, no authentication.
    pub fn open() -> Self {
        Self::fixed(Guard::default())
    }

    /// TLS with `acceptor` when given, no authentication (the reference service, whose
    /// lock API has its own).
    pub fn tls(acceptor: Option<tokio_rustls::TlsAcceptor>) -> Self {
        Self::fixed(Guard { tls: acceptor, ..Guard::default() })
    }

    /// Always `guard`.
    pub fn fixed(guard: Guard) -> Self {
        // The sender may go: a receiver keeps the last value.
        let (_sender, receiver) = watch::channel(Arc::new(guard));
        Self(receiver)
    }

    /// Whatever `receiver` holds at the time.
    pub fn watching(receiver: watch::Receiver<Arc<Guard>>) -> Self {
        Self(receiver)
    }

    /// Whether connections accepted now start with TLS.
    pub fn tls_now(&self) -> bool {
        self.current().tls.is_some()
    }

    fn current(&self) -> Arc<Guard> {
        self.0.borrow().clone()
    }
}

/// Connections open now, across every listener of the process (the flood test and the
/// allocator's trim read it).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Connections open now on every listener of this process.
pub fn open_connections() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Serves `app` on `listener` within `limits`, behind `guards`, until `shutdown`; then
/// stops accepting, lets each open connection finish the request it is serving, and
/// returns once they are closed.
pub async fn serve(
    listener: TcpListener,
    guards: Guards,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    // A semaphore holds at most usize::MAX >> 3 permits, and waiting for all of them
    // takes a u32: a million connections is beyond any descriptor limit anyway.
    let cap = limits.effective_connections().min(1 << 20);
    if cap < limits.max_connections {
        tracing::warn!(
            configured = limits.max_connections,
            cap,
            "--max-connections lowered to fit the file-descriptor limit (ulimit -n) less a reserve"
        );
    }
    let slots = Arc::new(Semaphore::new(cap));
    let closing = CancellationToken::new();
    loop {
        let slot = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed
            },
        };
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors despite the cap (another part of the process used
                // them): pause rather than spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (app, guards, closing) = (app.clone(), guards.clone(), closing.clone());
        tokio::spawn(async move {
            let _open = Open::new();
            connection(stream, peer, guards, app, limits, closing).await;
            drop(slot);
        });
    }
    drop(listener);
    closing.cancel();
    // Every connection holds a slot until it is done: having them all means all closed.
    let _all = slots.acquire_many(u32::try_from(cap).unwrap_or(u32::MAX)).await;
    Ok(())
}

/// Counts an open connection, and when the last of a flood closes, hands freed memory
/// back to the system.
struct Open;

/// Trimming walks the allocator's arenas: only after a flood worth it.
const TRIM_AFTER: usize = 256;

static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);

impl Open {
    fn new() -> Self {
        let now = OPEN.fetch_add(1, Ordering::Relaxed) + 1;
        HIGH_WATER.fetch_max(now, Ordering::Relaxed);
        Open
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let left = OPEN.fetch_sub(1, Ordering::Relaxed) - 1;
        if left <= TRIM_AFTER / 4 && HIGH_WATER.load(Ordering::Relaxed) >= TRIM_AFTER {
            HIGH_WATER.store(left, Ordering::Relaxed);
            trim();
        }
    }
}

/// Gives free heap pages back to the system. glibc keeps the pages a burst of
/// connections used (each thread's arena grows and is not returned on free), so a
/// process that served a flood would keep its peak RSS for good without this.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    guards: Guards,
    app: Router,
    limits: Limits,
    closing: CancellationToken,
) {
    let tls = guards.current().tls.clone();
    match tls {
        None => http(stream, guards, app, limits, closing).await,
        Some(acceptor) => match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => http(tls, guards, app, limits, closing).await,
            Ok(Err(e)) => tracing::info!(%peer, error = %e, "tls handshake refused"),
            Err(_) => tracing::info!(%peer, "tls handshake timed out"),
        },
    }
}

async fn http<S>(stream: S, guards: Guards, app: Router, limits: Limits, closing: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let (app, guard) = (app.clone(), guards.current());
        async move {
            if let Some(users) = &guard.users {
                let unguarded = UNGUARDED_PATHS.contains(&request.uri().path());
                if !unguarded && !users.admits(request.headers().get(header::AUTHORIZATION)).await {
                    return Ok::<_, Infallible>(with_headers(unauthorized(), &guard));
                }
            }
            // Every body is bounded, whatever reads it: axum's extractors answer 413 when
            // the limit is hit.
            let request = request.map(|body| Body::new(http_body_util::Limited::new(body, limits.max_request_body)));
            let response = app.oneshot(request).await?;
            Ok(with_headers(response, &guard))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_header_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = closing.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// 401 problem+json, asking for basic authentication.
fn unauthorized() -> Response {
    let body = serde_json::json!({
        "type": "urn:lockprobe:error:unauthorized",
        "title": "Unauthorized",
        "status": 401,
        "detail": "this endpoint needs HTTP basic authentication as a user of the web configuration (--web.config.file)",
    });
    let mut response = (StatusCode::UNAUTHORIZED, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"lockprobe\", charset=\"UTF-8\""));
    response
}

fn with_headers(mut response: Response, guard: &Guard) -> Response {
    for (name, value) in &guard.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_refused_by_flag() {
        let bad = |f: fn(&mut Limits)| {
            let mut l = Limits::default();
            f(&mut l);
            l.validate().unwrap_err().field
        };
        assert_eq!(bad(|l| l.header_read_timeout = Duration::ZERO), "header_read_timeout");
        assert_eq!(bad(|l| l.header_read_timeout = Duration::from_secs(301)), "header_read_timeout");
        assert_eq!(bad(|l| l.max_connections = 0), "max_connections");
        Limits::default().validate().unwrap();
    }

    #[test]
    fn the_cap_fits_the_descriptor_limit() {
        let limits = Limits { max_connections: usize::MAX, ..Limits::default() };
        match descriptor_limit() {
            Some(fds) => {
                assert_eq!(limits.effective_connections() as u64, fds.saturating_sub(DESCRIPTOR_RESERVE).max(1))
            }
            None => assert_eq!(limits.effective_connections(), usize::MAX),
        }
        assert_eq!(Limits { max_connections: 3, ..Limits::default() }.effective_connections(), 3);
    }
}
