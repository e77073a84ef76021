//! A loopback TCP proxy that tests can cut and heal, to take a server off the network
//! without losing its data.
//!
//! The proxy binds its port once and keeps it for its whole life: a cut closes each
//! connection as it is accepted instead of closing the listener, because a port given
//! back to the kernel can be taken by another test before the proxy binds it again.

#![allow(dead_code)] // each test crate uses a different part of this module

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// What the proxy does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward it to the upstream.
    Forward,
    /// Close it at once: the upstream is unreachable.
    Refuse,
    /// Hold it open and never answer: a hung upstream.
    Stall,
}

/// Forwards `127.0.0.1:port` to an upstream address while healed.
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl TcpProxy {
    /// Starts forwarding on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let mode = Arc::new(Mutex::new(Mode::Forward));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn(serve(listener, upstream, mode.clone(), connections.clone()));
        Self { port, mode, accept, connections }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Resets open connections and closes new ones at once: the upstream is unreachable.
    pub async fn cut(&mut self) {
        self.switch(Mode::Refuse);
    }

    /// Forwards again, on the same port.
    pub async fn heal(&mut self) {
        self.switch(Mode::Forward);
    }

    /// Accepts connections but never answers: a hung server, which only a client
    /// timeout can detect.
    pub async fn stall(&mut self) {
        self.switch(Mode::Stall);
    }

    /// Applies `mode` to new connections and drops every open one, so no request
    /// started under the old mode finishes under the new one.
    fn switch(&mut self, mode: Mode) {
        *self.mode.lock().expect("proxy mutex") = mode;
        for connection in self.connections.lock().expect("proxy mutex").drain(..) {
            connection.abort();
        }
    }
}

async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let task = match *mode.lock().expect("proxy mutex") {
            Mode::Refuse => continue, // `inbound` drops here: closed
            Mode::Forward => tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            }),
            Mode::Stall => tokio::spawn(async move {
                let _held = inbound;
                std::future::pending::<()>().await;
            }),
        };
        connections.lock().expect("proxy mutex").push(task.abort_handle());
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in self.connections.lock().expect("proxy mutex").drain(..) {
            connection.abort();
        }
    }
}
