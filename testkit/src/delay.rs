//! A network that takes time: a TCP proxy whose bytes arrive half a round
//! trip after they were sent, in each direction, and whose connections cost
//! a round trip before their first byte gets through, as a TCP handshake
//! does. Bandwidth is not limited and nothing is lost: what a client meets
//! is the latency of an AWS endpoint that is not on its own machine. Or a
//! slow service: what it is sent lands a while after it was sent (its
//! answers come at once), as with a destination that takes seconds a
//! request.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::mpsc,
    time::Instant,
};

/// A running delaying proxy.
#[derive(Debug)]
pub struct DelayProxy {
    /// Where clients reach it (`http://127.0.0.1:port`).
    pub url: String,
    /// Connections clients opened so far.
    pub connections: Arc<AtomicU64>,
}

impl DelayProxy {
    /// A proxy in front of `upstream` (`http://host:port` or `host:port`)
    /// with `round_trip` between a client and it.
    pub async fn start(upstream: &str, round_trip: Duration) -> std::io::Result<Self> {
        let half = round_trip / 2;
        Self::with(upstream, Delays { request: half, answer: half, handshake: round_trip }).await
    }

    /// A proxy in front of `upstream` through which each request takes
    /// `per_request`: its bytes land that long after they were sent; answers
    /// and connections take no time.
    pub async fn slow_service(upstream: &str, per_request: Duration) -> std::io::Result<Self> {
        Self::with(upstream, Delays { request: per_request, answer: Duration::ZERO, handshake: Duration::ZERO }).await
    }

    async fn with(upstream: &str, delays: Delays) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_owned();
        let connections = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(client, upstream.clone(), delays));
            }
        });
        Ok(Self { url, connections })
    }
}

/// How long bytes take through the proxy.
#[derive(Debug, Clone, Copy)]
struct Delays {
    /// From the client to the upstream.
    request: Duration,
    /// From the upstream to the client.
    answer: Duration,
    /// Before a connection's first byte from the client gets through.
    handshake: Duration,
}

/// Carries one connection both ways; the client's first bytes wait for the
/// handshake.
async fn serve(client: TcpStream, upstream: String, delays: Delays) {
    let handshake_done = Instant::now() + delays.handshake;
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_reads, client_writes) = client.into_split();
    let (server_reads, server_writes) = server.into_split();
    tokio::join!(
        carry(client_reads, server_writes, delays.request, handshake_done),
        carry(server_reads, client_writes, delays.answer, Instant::now()),
    );
}

/// Writes what `from` reads to `to`, each piece `delay` after it was read
/// (and not before `not_before` + `delay`), in order; closes `to`'s side
/// once `from` closes.
async fn carry(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration, not_before: Instant) {
    let (pieces, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(read @ 1..) = from.read(&mut buffer).await {
            let at = Instant::now().max(not_before) + delay;
            if pieces.send((at, buffer[..read].to_vec())).is_err() {
                return;
            }
        }
    };
    let writing = async move {
        while let Some((at, piece)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&piece).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes every byte back.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut reads, mut writes) = stream.split();
                    let _ = tokio::io::copy(&mut reads, &mut writes).await;
                });
            }
        });
        address
    }

    async fn exchange(stream: &mut TcpStream, message: &[u8]) -> Duration {
        let sent = Instant::now();
        stream.write_all(message).await.unwrap();
        let mut answer = vec![0; message.len()];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, message);
        sent.elapsed()
    }

    #[tokio::test]
    async fn each_exchange_takes_a_round_trip_and_a_new_connection_one_more() {
        let round_trip = Duration::from_millis(100);
        let proxy = DelayProxy::start(&echo_server().await, round_trip).await.unwrap();
        let mut stream = TcpStream::connect(proxy.url.trim_start_matches("http://")).await.unwrap();
        let first = exchange(&mut stream, b"hello").await;
        assert!(first >= round_trip * 2, "the first exchange took {first:?}");
        for _ in 0..3 {
            let later = exchange(&mut stream, b"again").await;
            assert!(later >= round_trip && later < round_trip * 2, "an exchange took {later:?}");
        }
        assert_eq!(proxy.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn pipelined_bytes_keep_their_order_and_share_the_delay() {
        let round_trip = Duration::from_millis(100);
        let proxy = DelayProxy::start(&echo_server().await, round_trip).await.unwrap();
        let mut stream = TcpStream::connect(proxy.url.trim_start_matches("http://")).await.unwrap();
        exchange(&mut stream, b"open").await;
        let message: Vec<u8> = (0..200_000u32).map(|n| (n % 251) as u8).collect();
        let took = exchange(&mut stream, &message).await;
        assert!(took < round_trip * 3, "200 kB took {took:?}: pieces waited for each other");
    }
}
