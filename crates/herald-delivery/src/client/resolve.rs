//! Where a delivery may connect: the pluggable name resolver and the vetting of every address it answers
//! against the [`AddressPolicy`].

use std::net::{IpAddr, SocketAddr};

use herald_core::address::AddressPolicy;

use super::error::ConnectError;

/// Looks up the addresses of a host name. Pluggable so tests can answer without DNS.
pub trait HostResolver: Send + Sync + 'static {
    /// Resolve `host` to its addresses.
    fn lookup(&self, host: &str) -> futures::future::BoxFuture<'static, Result<Vec<IpAddr>, String>>;
}

/// The system resolver (hickory, configured from `/etc/resolv.conf`).
pub struct SystemResolver {
    inner: hickory_resolver::TokioResolver,
}

impl SystemResolver {
    /// Build from the system configuration.
    pub fn new() -> Result<Self, String> {
        let inner = hickory_resolver::Resolver::builder_tokio()
            .map_err(|e| format!("resolver configuration: {e}"))?
            .build()
            .map_err(|e| format!("resolver: {e}"))?;
        Ok(Self { inner })
    }
}

impl HostResolver for SystemResolver {
    fn lookup(&self, host: &str) -> futures::future::BoxFuture<'static, Result<Vec<IpAddr>, String>> {
        let resolver = self.inner.clone();
        let host = host.to_owned();
        Box::pin(async move {
            let found = resolver.lookup_ip(host.as_str()).await.map_err(|e| e.to_string())?;
            Ok(found.iter().collect())
        })
    }
}

/// Resolves `host` (or takes it as an IP literal) and vets every address against `policy`: the addresses a
/// connection to `host:port` may use, in the resolver's order.
///
/// IPv4-mapped answers are unmapped first (a dual-stack socket would connect to the IPv4 address). A name with
/// any denied answer is refused as a whole, with the rule of the first denied address; a literal is checked as
/// written. Pure policy plus one lookup, no sockets: tests can drive it with any address.
pub async fn checked_addresses(
    policy: &AddressPolicy,
    resolver: &dyn HostResolver,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, ConnectError> {
    policy
        .check_port(port)
        .map_err(|rejected| ConnectError::Blocked(rejected.to_string()))?;
    // `Uri::host` keeps the brackets of an IPv6 literal.
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        policy
            .check_ip(ip)
            .map_err(|denied| ConnectError::Blocked(denied.to_string()))?;
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let found = resolver.lookup(bare).await.map_err(|reason| ConnectError::Resolve {
        host: bare.to_owned(),
        reason,
    })?;
    if found.is_empty() {
        return Err(ConnectError::Resolve {
            host: bare.to_owned(),
            reason: "no addresses".to_owned(),
        });
    }
    let mut allowed = Vec::with_capacity(found.len());
    for ip in found.into_iter().map(unmap) {
        if let Err(denied) = policy.check_ip(ip) {
            return Err(ConnectError::Blocked(format!(
                "{bare} resolved to a denied address: {denied}"
            )));
        }
        allowed.push(SocketAddr::new(ip, port));
    }
    Ok(allowed)
}

/// `::ffff:a.b.c.d` is the IPv4 address a.b.c.d on a dual-stack socket; connect to (and report) it as such.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
