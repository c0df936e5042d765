//! An HTTPS endpoint in front of a plain one, as AWS's endpoints are: a proxy
//! that terminates TLS with a certificate made for it at start and forwards
//! the bytes to the plain server (DynamoDB Local). Clients trust the
//! certificate through `SSL_CERT_FILE` (see [`TlsProxy::certificate`]),
//! which the AWS SDK's default client reads beside the system's roots. Put a [`DelayProxy`](crate::delay::DelayProxy) in
//! front of it to make the handshake's round trips cost what they do across
//! a network.

use std::{path::PathBuf, sync::Arc};

use rustls::{
    ServerConfig,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A running TLS-terminating proxy.
#[derive(Debug)]
pub struct TlsProxy {
    /// Where clients reach it (`https://localhost:port`).
    pub url: String,
    /// Its listening address (`127.0.0.1:port`), for a proxy in front of it.
    pub address: String,
    /// The PEM file of its self-signed certificate (for `localhost` and
    /// `127.0.0.1`): what a client's `SSL_CERT_FILE` names to trust it.
    pub certificate: PathBuf,
    _directory: tempfile::TempDir,
}

impl TlsProxy {
    /// A proxy in front of `upstream` (`http://host:port` or `host:port`).
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let made = rcgen::generate_simple_self_signed(names).map_err(std::io::Error::other)?;
        let directory = tempfile::tempdir()?;
        let certificate = directory.path().join("certificate.pem");
        std::fs::write(&certificate, made.cert.pem())?;
        let chain = vec![made.cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|config| config.with_no_client_auth().with_single_cert(chain, key))
            .map_err(std::io::Error::other)?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_owned();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, acceptor.clone(), upstream.clone()));
            }
        });
        let url = format!("https://localhost:{}", address.port());
        Ok(Self { url, address: address.to_string(), certificate, _directory: directory })
    }
}

/// Completes the handshake, then carries the connection both ways.
async fn serve(client: TcpStream, acceptor: TlsAcceptor, upstream: String) {
    let _ = client.set_nodelay(true);
    let Ok(mut client) = acceptor.accept(client).await else { return };
    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_client_trusting_its_certificate_reaches_the_server_behind_it() {
        // A plain server that answers every connection with a fixed response.
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = plain.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = plain.accept().await {
                let mut request = [0; 64];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
        });
        let proxy = TlsProxy::start(&upstream).await.unwrap();

        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_file_iter(&proxy.certificate).unwrap() {
            roots.add(certificate.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = TcpStream::connect(&proxy.address).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, stream).await.expect("the certificate is trusted for localhost");
        tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        assert!(answer.ends_with(b"ok"), "{}", String::from_utf8_lossy(&answer));
    }
}
