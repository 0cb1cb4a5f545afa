//! The TLS configuration every outbound client of Herald uses — the delivery client of `herald serve` and
//! the forwarder of `herald inbox` — so that both trust the same roots, offer the same protocols and
//! accept the same versions, and a change to one is a change to both.

use std::sync::Arc;

/// A client configuration: ring as the crypto provider, rustls's safe default protocol versions (TLS 1.2
/// and 1.3), the Mozilla roots bundled by `webpki-roots` (never the host's store, so a node trusts
/// what every node trusts), no client certificate, and ALPN offering HTTP/2 then HTTP/1.1.
///
/// # Errors
///
/// The provider does not support the default protocol versions (it always does with ring; the error is
/// rustls's to return, not ours to hide).
pub fn client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Without ALPN, HTTP/2 is never negotiated.
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_h2_then_http1_and_trusts_the_bundled_roots() {
        let tls = client_config().expect("ring supports the default versions");
        assert_eq!(tls.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        // No client certificate is ever offered.
        assert!(!tls.client_auth_cert_resolver.has_certs());
    }
}
