//! An endpoint that is down, then up: a TCP proxy that closes every
//! connection at once until [`Outage::end`], and carries them to the real
//! server from then on. What a process started beside a service that is
//! still starting, or behind a network not yet up, meets.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use tokio::net::{TcpListener, TcpStream};

/// A running proxy in an outage until it is ended.
#[derive(Debug)]
pub struct Outage {
    /// Where clients reach it (`http://127.0.0.1:port`).
    pub url: String,
    /// Connections closed unanswered so far.
    pub refused: Arc<AtomicU64>,
    up: Arc<AtomicBool>,
}

impl Outage {
    /// A proxy in front of `upstream` (`http://host:port` or `host:port`),
    /// down until [`end`](Self::end).
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_owned();
        let (up, refused) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (serving, refusing) = (Arc::clone(&up), Arc::clone(&refused));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if serving.load(Ordering::SeqCst) {
                    tokio::spawn(carry(client, upstream.clone()));
                } else {
                    refusing.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                }
            }
        });
        Ok(Self { url, refused, up })
    }

    /// The service is back: connections from now on reach it.
    pub fn end(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// Carries one connection both ways until either side closes.
async fn carry(mut client: TcpStream, upstream: String) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
