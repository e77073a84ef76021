//! A loopback TCP proxy that tests can cut and heal, to take a server off the network
//! without losing its data.

#![allow(dead_code)] // each test crate uses a different part of this module

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// Forwards `127.0.0.1:port` to an upstream address while healed.
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    upstream: SocketAddr,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl TcpProxy {
    /// Starts forwarding on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let mut proxy = Self { port, upstream, accept: None, connections: Arc::default() };
        proxy.serve(listener);
        proxy
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn serve(&mut self, listener: TcpListener) {
        let (upstream, connections) = (self.upstream, self.connections.clone());
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                connections.lock().expect("proxy mutex").push(task.abort_handle());
            }
        }));
    }

    /// Refuses new connections and resets open ones: the upstream is unreachable.
    pub async fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
            let _ = accept.await; // the listener is closed once the task is gone
        }
        for connection in self.connections.lock().expect("proxy mutex").drain(..) {
            connection.abort();
        }
    }

    /// Forwards on the same port again.
    pub async fn heal(&mut self) {
        self.cut().await;
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.expect("re-bind proxy port");
        self.serve(listener);
    }

    /// Accepts connections but never answers: a hung server, which only a client
    /// timeout can detect.
    pub async fn stall(&mut self) {
        self.cut().await;
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.expect("re-bind proxy port");
        let connections = self.connections.clone();
        self.accept = Some(tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    let _held = inbound;
                    std::future::pending::<()>().await;
                });
                connections.lock().expect("proxy mutex").push(task.abort_handle());
            }
        }));
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        for connection in self.connections.lock().expect("proxy mutex").drain(..) {
            connection.abort();
        }
    }
}
