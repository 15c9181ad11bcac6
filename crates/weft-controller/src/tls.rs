//! TLS for the controller's API and for its clients (the CLI, the agent, the tests).
//!
//! The server side ([`ServerTls`]) loads a certificate chain and key from PEM files, or
//! makes a self-signed pair for a first start ([`ServerTls::self_signed`]) whose SHA-256
//! fingerprint the operator gives the clients. [`TlsListener`] does the handshakes off
//! the accept loop (each bounded), so a slow or silent client holds up nobody.
//!
//! The client side ([`ClientTls`]) trusts either a CA file (the usual chain and name
//! checks) or one pinned certificate (`sha256:<hex>` of the DER certificate, the name
//! not checked: a pin says exactly which certificate is the controller's). Plain HTTP is
//! allowed only to a loopback address unless [`ClientTls::insecure_http`] says otherwise
//! ([`check_plain_http`]), and the controller refuses to listen in plain HTTP off
//! loopback on the same terms.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// Why TLS could not be set up, or a URL or address is refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file that cannot be read or holds no usable PEM.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A pin that is not `sha256:` and 64 hex digits.
    #[error(
        "pin `{0}`: expected sha256: and 64 hex digits (colons allowed), as `weft controller --tls-self-signed` prints"
    )]
    Pin(String),
    /// rustls refused the configuration (a key that does not match the certificate, ...).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// Making the self-signed certificate failed.
    #[error("self-signed certificate: {0}")]
    Generate(String),
    /// Plain HTTP off loopback without `--insecure-http`.
    #[error(
        "{what} {target} is plain HTTP off loopback: bearer tokens and agent secrets would cross the network in clear; use https:// (--tls-cert/--tls-key or --tls-self-signed on the controller, --ca-file or --pin on clients), or pass --insecure-http to accept that"
    )]
    PlainHttp {
        /// "controller URL" or "listen address".
        what: &'static str,
        /// The URL or address.
        target: String,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 fingerprint of a DER certificate, as `sha256:<64 lowercase hex>`.
pub fn fingerprint(cert_der: &[u8]) -> String {
    let digest = Sha256::digest(cert_der);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses a pin: `sha256:` then 64 hex digits, case-insensitive, colons allowed between
/// bytes (OpenSSL's `-fingerprint` form); returns the 32 bytes.
pub fn parse_pin(pin: &str) -> Result<[u8; 32], TlsError> {
    let bad = || TlsError::Pin(pin.chars().take(120).collect());
    let trimmed = pin.trim();
    let hex = trimmed
        .strip_prefix("sha256:")
        .or_else(|| trimmed.strip_prefix("SHA256:"))
        .ok_or_else(bad)?;
    let digits: String = hex.chars().filter(|c| *c != ':').collect();
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

fn file_err(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(path, "holds no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The controller's certificate and key.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    fingerprint: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads a PEM certificate chain (leaf first) and its PEM private key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let certs = read_certs(cert)?;
        let key_der = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| file_err(key, format!("no usable PEM private key: {e}")))?;
        Self::from_der(certs, key_der)
    }

    fn from_der(
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<ServerTls, TlsError> {
        let fingerprint = certs
            .first()
            .map(|c| fingerprint(c.as_ref()))
            .ok_or_else(|| TlsError::Config("no certificate".into()))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(ServerTls {
            config: Arc::new(config),
            fingerprint,
        })
    }

    /// A self-signed certificate for `names` (host names and IP addresses), written to
    /// `cert` and `key` (mode 0600) when they do not exist yet, else loaded from them, so
    /// that a restart keeps the fingerprint the clients pinned. Returns whether it was
    /// made now.
    pub fn self_signed(
        cert: &Path,
        key: &Path,
        names: &[String],
    ) -> Result<(ServerTls, bool), TlsError> {
        if cert.exists() || key.exists() {
            return Ok((Self::from_files(cert, key)?, false));
        }
        let made = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        let key_pem = made.key_pair.serialize_pem();
        write_private(key, key_pem.as_bytes())?;
        write_private(cert, made.cert.pem().as_bytes())?;
        Ok((Self::from_files(cert, key)?, true))
    }

    /// `sha256:<hex>` of the leaf certificate: what clients pin.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The rustls configuration.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| file_err(path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| file_err(path, e))
}

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// A listener whose connections have finished a TLS handshake, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` and shakes hands with `tls`, each handshake bounded by
    /// [`HANDSHAKE_TIMEOUT`]; a failed handshake is logged and dropped.
    pub fn new(tcp: TcpListener, tls: &ServerTls) -> TlsListener {
        let local = crate::server::local(&tcp);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let (tx, ready) = mpsc::channel(64);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task ended (the runtime is shutting down): nothing comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// How a client trusts the controller.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM CA certificates to verify the controller's chain and name against.
    pub ca_file: Option<PathBuf>,
    /// The controller certificate's fingerprint (`sha256:<hex>`); when given, exactly that
    /// certificate is accepted and its name is not checked.
    pub pin: Option<String>,
    /// Allow `http://` to an address that is not loopback.
    pub insecure_http: bool,
}

impl ClientTls {
    /// The rustls configuration for these settings: `None` when neither a CA file nor a
    /// pin is given (the built-in web roots then apply).
    pub fn rustls_config(&self) -> Result<Option<rustls::ClientConfig>, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        if let Some(pin) = &self.pin {
            let verifier = PinVerifier {
                pin: parse_pin(pin)?,
                provider: provider(),
            };
            return Ok(Some(
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(verifier))
                    .with_no_client_auth(),
            ));
        }
        let Some(ca) = &self.ca_file else {
            return Ok(None);
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs(ca)? {
            roots
                .add(c)
                .map_err(|e| file_err(ca, format!("not a usable CA certificate: {e}")))?;
        }
        Ok(Some(
            builder.with_root_certificates(roots).with_no_client_auth(),
        ))
    }
}

/// Refuses `http://` to a host that is not a loopback address (or `localhost`) unless
/// `insecure` is set. Other schemes pass (the HTTP client judges them).
pub fn check_plain_http(url: &str, insecure: bool) -> Result<(), TlsError> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(());
    };
    if insecure {
        return Ok(());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(TlsError::PlainHttp {
            what: "controller URL",
            target: url.to_string(),
        })
    }
}

/// Refuses to serve plain HTTP on `addr` unless it is a loopback address or `insecure`.
pub fn check_plain_listen(addr: SocketAddr, insecure: bool) -> Result<(), TlsError> {
    if insecure || addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(TlsError::PlainHttp {
            what: "listen address",
            target: addr.to_string(),
        })
    }
}

/// Accepts exactly the certificate whose SHA-256 is the pin (and checks the handshake's
/// signatures with it, so the peer must hold its key).
#[derive(Debug)]
struct PinVerifier {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = Sha256::digest(end_entity.as_ref());
        if got.as_slice() == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the controller's certificate is {}, not the pinned one (sha256:{}); refusing to send a token to it",
                fingerprint(end_entity.as_ref()),
                self.pin
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_in_both_spellings_and_bad_ones_are_named() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_pin(&format!("sha256:{hex}")).unwrap(), [0xab; 32]);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_pin(&format!("SHA256:{colons}")).unwrap(), [0xab; 32]);
        for bad in [
            "",
            "ab",
            &hex,
            &format!("sha256:{}", &hex[2..]),
            "sha256:zz",
        ] {
            let e = parse_pin(bad).unwrap_err().to_string();
            assert!(e.contains("64 hex digits"), "{bad}: {e}");
        }
    }

    #[test]
    fn plain_http_is_refused_off_loopback_only() {
        for ok in [
            "http://127.0.0.1:7100",
            "http://localhost:7100/",
            "http://[::1]:7100",
            "http://127.8.9.1",
            "https://10.0.0.1:7100",
        ] {
            check_plain_http(ok, false).unwrap();
        }
        for bad in [
            "http://10.0.0.1:7100",
            "http://ctl:7100",
            "http://[fe80::1]:7100",
            "http://127.0.0.1.evil:7100",
            "http://user@10.0.0.1/",
        ] {
            let e = check_plain_http(bad, false).unwrap_err().to_string();
            assert!(e.contains("--insecure-http") && e.contains(bad), "{e}");
            check_plain_http(bad, true).unwrap();
        }
        check_plain_listen("127.0.0.1:7100".parse().unwrap(), false).unwrap();
        assert!(check_plain_listen("0.0.0.0:7100".parse().unwrap(), false).is_err());
        check_plain_listen("0.0.0.0:7100".parse().unwrap(), true).unwrap();
    }

    #[test]
    fn a_self_signed_pair_is_kept_across_starts() {
        let d = tempfile::tempdir().unwrap();
        let (cert, key) = (d.path().join("c.pem"), d.path().join("k.pem"));
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let (a, made) = ServerTls::self_signed(&cert, &key, &names).unwrap();
        assert!(made);
        let (b, made) = ServerTls::self_signed(&cert, &key, &names).unwrap();
        assert!(!made);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert!(a.fingerprint().starts_with("sha256:") && a.fingerprint().len() == 71);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
