//! The connector hyper's pool calls: vet the host, connect to one of the checked addresses (through the
//! proxy when one is set), then TLS with the hostname as SNI — all within the connect timeout.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use herald_core::address::AddressPolicy;
use http::Uri;
use tokio::net::TcpStream;

use super::conn::Conn;
use super::error::ConnectError;
use super::proxy::Proxy;
use super::resolve::{HostResolver, checked_addresses};

/// The connector: vet, pin, optionally tunnel, then TLS with the hostname as SNI.
#[derive(Clone)]
pub struct PinnedConnector {
    inner: Arc<ConnectorInner>,
}

impl PinnedConnector {
    /// A connector enforcing `policy`, resolving names with `resolver`, speaking TLS with `tls`, through
    /// `proxy` when one is set.
    pub(super) fn new(
        policy: Arc<AddressPolicy>,
        resolver: Arc<dyn HostResolver>,
        tls: tokio_rustls::TlsConnector,
        proxy: Option<Proxy>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(ConnectorInner {
                policy,
                resolver,
                tls,
                proxy,
                connect_timeout,
            }),
        }
    }
}

struct ConnectorInner {
    policy: Arc<AddressPolicy>,
    resolver: Arc<dyn HostResolver>,
    tls: tokio_rustls::TlsConnector,
    proxy: Option<Proxy>,
    connect_timeout: Duration,
}

impl ConnectorInner {
    async fn connect(&self, uri: Uri) -> Result<Conn, ConnectError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => return Err(ConnectError::Destination(format!("scheme {other:?}"))),
        };
        let host = uri
            .host()
            .ok_or_else(|| ConnectError::Destination("no host".to_owned()))?
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addrs = checked_addresses(&self.policy, self.resolver.as_ref(), &host, port).await?;
        let connect = async {
            let tcp = self.tcp(&addrs).await?;
            // Small request heads and bodies: send them now rather than waiting on Nagle.
            let _ = tcp.set_nodelay(true);
            if !https {
                return Ok(Conn::plain(tcp));
            }
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(&host);
            // SNI and certificate check use the name from the URL, never the pinned address.
            let name = rustls::pki_types::ServerName::try_from(bare.to_owned())
                .map_err(|e| ConnectError::Destination(format!("server name {bare:?}: {e}")))?;
            let tls = self.tls.connect(name, tcp).await.map_err(|source| ConnectError::Tls {
                host: bare.to_owned(),
                source,
            })?;
            Ok(Conn::tls(tls))
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| ConnectError::Timeout(self.connect_timeout))?
    }

    /// A TCP stream to the first of the checked addresses that answers (through the proxy when one is set).
    async fn tcp(&self, addrs: &[SocketAddr]) -> Result<TcpStream, ConnectError> {
        let mut last = ConnectError::Destination("no address".to_owned());
        for addr in addrs {
            let attempt = match &self.proxy {
                Some(proxy) => proxy.tunnel(*addr).await,
                None => TcpStream::connect(addr).await.map_err(|source| ConnectError::Io {
                    addr: addr.to_string(),
                    source,
                }),
            };
            match attempt {
                Ok(tcp) => return Ok(tcp),
                Err(error) => last = error,
            }
        }
        Err(last)
    }
}

impl tower_service::Service<Uri> for PinnedConnector {
    type Response = Conn;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.connect(uri).await })
    }
}
